"""store/sql.py's own literal escaping gives clickhouse-driver's text for every kind of
value, and a bound query runs on chdb and reads the value back as it was."""

from __future__ import annotations

import datetime as dt
import enum
import random
import uuid
from types import SimpleNamespace

import pytest
from clickhouse_driver.util.escape import escape_param as driver_escape

from ranksight.store.sql import bind, escape_param


class Color(enum.Enum):
    RED = "r'ed"
    ONE = 1


def _driver(value: object, tz: str = "UTC") -> object:
    context = SimpleNamespace(server_info=SimpleNamespace(get_timezone=lambda: tz))
    return driver_escape(value, context)


def _values() -> list[object]:
    rng = random.Random(20)
    alphabet = "ab'\\\"\b\f\r\n\t\0\a\v%()[],é漢\U0001f600 \x7f\x01"
    texts = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12))) for _ in range(300)]
    aware = dt.datetime(2026, 12, 2, 3, 4, 5, tzinfo=dt.timezone(dt.timedelta(hours=5)))
    return [
        None, 0, -1, 2**63 - 1, 2**64 - 1, 1.5, -0.0, float("inf"), "", *texts,
        dt.datetime(2026, 1, 2, 3, 4, 5, 678), aware, dt.date(1999, 12, 31), dt.time(23, 59, 1),
        uuid.UUID(int=12345), Color.RED, Color.ONE, [1, "a'b", None], (1, 2, "x\\y"),
        ([1, 2], ("q",)), [], (), [[["deep'"]]],
    ]  # fmt: skip


@pytest.mark.parametrize("tz", ["UTC", "Asia/Tokyo", "America/Los_Angeles"])
def test_escape_matches_clickhouse_driver(tz: str) -> None:
    values = _values()
    ours = [escape_param(v, tz) for v in values]
    theirs = [_driver(v, tz) for v in values]
    assert ours == theirs
    assert "[1, 'a\\'b', NULL]" in ours  # the comparison saw escaped strings, not a no-op


def test_bound_strings_read_back_on_chdb(tmp_path) -> None:
    from ranksight.store import open_store

    store = open_store(str(tmp_path / "s"))
    store.init_schema()
    texts = [t for t in _values() if isinstance(t, str) and "\0" not in t][:60]
    got = store.query(
        "SELECT arrayJoin(%(t)s) AS t FROM (SELECT count() AS n FROM schema_version) AS v",
        {"t": texts},
    )
    assert list(got["t"]) == texts
    assert bind("SELECT %(a)s", {"a": ("x", 1)}) == "SELECT ('x', 1)"
