"""What the importer fuzz tests (tests/unit/test_import_fuzz_formats.py) share: values that
break readers (wrong types, huge ints, inf/nan, lists for ints), mutation of a decoded
structure at random places, an in-memory store that checks every row against its
column, and the check that an import neither raised nor stored a row that does not fit.

``RANKSIGHT_FUZZ_EXAMPLES`` sets the examples per test (default 40: about a minute for
all formats); a long local run: ``RANKSIGHT_FUZZ_EXAMPLES=3000``."""

from __future__ import annotations

import copy
import math
import os

import pandas as pd
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from ranksight.importer import ImportConfig, import_paths
from ranksight.store.schema import table

EXAMPLES = int(os.environ.get("RANKSIGHT_FUZZ_EXAMPLES", "40"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                           HealthCheck.data_too_large],
)  # fmt: skip
RANGES = {"UInt8": (0, 1 << 8), "UInt32": (0, 1 << 32), "UInt64": (0, 1 << 64),
          "Int32": (-(1 << 31), 1 << 31), "Int64": (-(1 << 63), 1 << 63)}  # fmt: skip
INTERNAL = "cannot be read ("
"""The importer's last-resort message for an exception no reader named: a defect."""

nasty = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(1 << 70), 1 << 70),
    st.sampled_from([1 << 31, 1 << 32, 1 << 63, 1 << 64, -(1 << 63) - 1, -1, 0, 10**30]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([math.inf, -math.inf, math.nan, 1e300]),
    st.text(max_size=8),
    st.sampled_from(["7", "-1", "1e400", "nan", "[0, 1]", "0x10", "\udcff", ""]),
    st.lists(st.integers(-5, 1 << 65), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    st.lists(st.lists(st.integers(-3, 1 << 64), max_size=2), max_size=2),
)
"""A value where a reader expects another."""


def places(obj, path=()) -> list[tuple]:
    """Every path (keys and indexes) into ``obj``'s dicts and lists, ``obj`` itself
    first; lists past 30 items are sampled at their first 30."""
    out = [path]
    if isinstance(obj, dict):
        for k, v in list(obj.items())[:60]:
            out.extend(places(v, (*path, k)))
    elif isinstance(obj, list):
        for i, v in enumerate(obj[:30]):
            out.extend(places(v, (*path, i)))
    return out


@st.composite
def mutated(draw, seed, most: int = 6):
    """A deep copy of ``seed`` with up to ``most`` places replaced by a :data:`nasty`
    value, deleted, or (a list item) replaced by a non-dict."""
    doc = copy.deepcopy(seed)
    for _ in range(draw(st.integers(1, most))):
        spots = places(doc)[1:]
        if not spots:
            break
        path = draw(st.sampled_from(spots))
        parent = doc
        for k in path[:-1]:
            parent = parent[k]
        how = draw(st.sampled_from(["replace", "replace", "replace", "delete"]))
        if how == "delete" and isinstance(parent, dict):
            del parent[path[-1]]
        else:
            parent[path[-1]] = draw(nasty)
    return doc


class CheckingStore:
    """A store that keeps what is inserted and checks every value against its column:
    integers within the column type, floats finite or NaN, text valid UTF-8."""

    folder = None

    def __init__(self) -> None:
        self.rows: dict[str, int] = {}

    def insert(self, name: str, frame: pd.DataFrame) -> None:
        for col, kind in table(name).columns:
            values = frame[col].tolist()
            if kind in RANGES:
                lo, hi = RANGES[kind]
                assert all(lo <= int(v) < hi for v in values), (name, col)
            elif kind == "Float64":
                assert all(isinstance(v, float) and not math.isinf(v) for v in values), (name, col)
            else:
                assert all(isinstance(v, str) for v in values), (name, col)
                for v in values:
                    v.encode("utf-8")
        self.rows[name] = self.rows.get(name, 0) + len(frame)

    def query(self, sql: str, params: dict | None = None) -> pd.DataFrame:
        """Nothing is kept to read back: every query finds no row."""
        return pd.DataFrame()


def check_import(paths: list[str], memory_mb: int = 64):
    """Import ``paths`` into a :class:`CheckingStore`: nothing raised, every failed file
    named with its reader's own message (never :data:`INTERNAL`), a ``runs`` row where a
    file was imported and no row at all where none was."""
    store = CheckingStore()
    result = import_paths(store, paths, ImportConfig(run_id="fuzz", memory_mb=memory_mb))
    for f in result.failed:
        assert INTERNAL not in f.message, f.message
        assert f.path and f.message
    if result.imported:
        assert store.rows.get("runs") == 1
    else:
        assert store.rows == {}, f"rows of no imported file: {store.rows}"
    return result, store
