"""Fuzzing every import format with hypothesis, seeded from the real fixtures
(tests/data/realdata, tests/data/fr): Flight Recorder dumps (pickle and JSON, gzip or
not, cut short), Kineto traces, py-spy dumps (JSON and text), What-if Analysis traces and
text logs, their decoded structure mutated (wrong types, huge ints, inf/nan, lists for
ints, keys deleted, non-dict entries). An import of a mutated file beside a good one
never raises, names the bad file with its reader's own message, stores every row of the
good file, and stores no value that does not fit its column (tests/helpers/fuzz_inputs.py).
``RANKSIGHT_FUZZ_EXAMPLES`` sets the examples per test."""

from __future__ import annotations

import glob
import gzip
import json
import os
import pickle
import shutil

import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ranksight.importer import ImportConfig, import_paths
from tests.helpers.fuzz_inputs import FUZZ, CheckingStore, check_import, mutated, nasty
from tests.helpers.realdata import realdata
from tests.helpers.realworld import CORPUS

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FR = os.path.join(TESTS, "data", "fr")
RANK_NAMES = st.sampled_from(["0", "3", "15", str(1 << 31), str(1 << 40), "9" * 25, "x"])


def _fr_seeds() -> list[dict]:
    seeds = []
    for path in [os.path.join(FR, "nccl_h200x2", "nccl_trace_rank_1.gz"),
                 os.path.join(FR, "gloo_cpu", "fr_gloo_rank0.pkl.gz"),
                 realdata("nvrx_fr_dumps", "gpu_error_1st", "_dump_14")]:  # fmt: skip
        with open(path, "rb") as f:
            data = f.read()
        doc = pickle.loads(gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data)
        doc["entries"] = doc["entries"][-12:]  # the newest: pending work among them
        seeds.append(doc)
    return seeds


def _kineto_seeds() -> list[dict]:
    seeds = []
    for name in ("trace_filter_sampled_rank-0.json.gz", "nccl_parser_config_nccl_data.json.gz"):
        with gzip.open(realdata("kineto_hta", name)) as f:
            doc = json.load(f)
        ev = doc["traceEvents"]
        steps = [e for e in ev if str(e.get("name", "")).startswith("ProfilerStep")][:2]
        nccl = [e for e in ev if str(e.get("name", "")).startswith("ncclKernel")
                or str(e.get("name", "")).startswith("ncclDevKernel")][:6]  # fmt: skip
        other = [e for e in ev if e.get("cat") == "kernel" and e not in nccl][:6]
        doc["traceEvents"] = steps + nccl + other + [e for e in ev if e.get("ph") == "M"][:2]
        seeds.append(doc)
    return seeds


FR_SEEDS, KINETO_SEEDS = _fr_seeds(), _kineto_seeds()
PYSPY_TEXT = open(realdata("handed", "pyspy_loader_stall_8r", "rank0.txt")).read()
GOOD_DUMP = os.path.join(FR, "nccl_h200x2", "nccl_trace_rank_0.gz")


def _good(folder) -> str:
    """A real dump beside the bad file: its rows must all be stored."""
    return shutil.copy(GOOD_DUMP, folder / "good_rank_0.gz")


def _good_rows() -> dict[str, int]:
    store = CheckingStore()
    import_paths(store, [GOOD_DUMP], ImportConfig(run_id="good"))
    return store.rows


GOOD_ROWS = _good_rows()


def _kept_the_good_one(result, store, bad: str) -> None:
    by = {os.path.basename(f.path): f for f in result.files}
    assert by["good_rank_0.gz"].ok, by["good_rank_0.gz"].message
    for t in ("fr_entries", "collectives", "progress"):
        if "good_rank_0.gz" in by and not by[bad].ok:
            assert store.rows.get(t, 0) >= GOOD_ROWS[t], (t, store.rows)


@FUZZ
@given(
    doc=st.sampled_from(FR_SEEDS).flatmap(mutated),
    how=st.sampled_from(["pickle", "json", "pickle.gz", "json.gz", "cut"]),
    rank=RANK_NAMES,
)
def test_flight_recorder_dumps_mutated(tmp_path_factory, doc, how, rank) -> None:
    folder = tmp_path_factory.mktemp("fr")
    if how.startswith("json"):
        data = json.dumps(doc, default=str).encode()
    else:
        data = pickle.dumps(doc)
    if how == "cut":
        data = data[: len(data) * 2 // 3]
    if how.endswith(".gz"):
        data = gzip.compress(data)
    bad = f"nccl_trace_rank_{rank}"
    (folder / bad).write_bytes(data)
    _good(folder)
    result, store = check_import([str(folder)])
    _kept_the_good_one(result, store, bad)
    check_import([str(folder / bad)])


@FUZZ
@given(doc=st.sampled_from(KINETO_SEEDS).flatmap(mutated), gz=st.booleans())
def test_kineto_traces_mutated(tmp_path_factory, doc, gz) -> None:
    folder = tmp_path_factory.mktemp("kineto")
    data = json.dumps(doc, default=str).replace('"1e400"', "1e400").encode()  # inf ts
    doc.setdefault("traceEvents", [])
    bad = "trace_rank-1.json" + (".gz" if gz else "")
    (folder / bad).write_bytes(gzip.compress(data) if gz else data)
    _good(folder)
    result, store = check_import([str(folder)])
    _kept_the_good_one(result, store, bad)
    check_import([str(folder / bad)])


def _pyspy_json() -> list[dict]:
    from ranksight.importer.pyspy import parse_text

    return parse_text(PYSPY_TEXT)[1]


@st.composite
def pyspy_text(draw) -> str:
    lines = PYSPY_TEXT.splitlines()
    for _ in range(draw(st.integers(1, 5))):
        i = draw(st.integers(0, len(lines) - 1))
        cut = draw(st.integers(0, len(lines[i])))
        lines[i] = lines[i][:cut] + str(draw(nasty)) + lines[i][cut:]
    return "\n".join(lines)


@FUZZ
@given(threads=mutated(_pyspy_json()), pid=nasty, text=pyspy_text(),
       form=st.sampled_from(["list", "object", "text"]))  # fmt: skip
def test_pyspy_dumps_mutated(tmp_path_factory, threads, pid, text, form) -> None:
    folder = tmp_path_factory.mktemp("pyspy")
    if form == "text":
        data = text
    elif form == "list":
        data = json.dumps(threads, default=str)
    else:
        data = json.dumps({"pid": pid, "threads": threads}, default=str)
    bad = "rank5.txt"
    (folder / bad).write_text(data, encoding="utf-8", errors="surrogateescape")
    _good(folder)
    result, store = check_import([str(folder)])
    _kept_the_good_one(result, store, bad)
    check_import([str(folder / bad)])


WIA = pd.read_parquet(realdata("wia_AR", "trace-AR.parquet")).groupby("rank").head(40)
WIA_COLUMNS = list(WIA.columns)


@FUZZ
@given(cells=st.lists(st.tuples(st.integers(0, len(WIA) - 1), st.sampled_from(WIA_COLUMNS),
                                nasty.filter(lambda v: not isinstance(v, (list, dict)))),
                      max_size=6),
       text_col=st.one_of(st.none(), st.sampled_from(WIA_COLUMNS)),
       drop=st.one_of(st.none(), st.sampled_from(WIA_COLUMNS)),
       meta=st.sampled_from(["dp_size: 4\npp_size: 4\ntp_size: 4\n", "dp_size: 0\npp_size: 0\n",
                             f"dp_size: {10**30}\npp_size: 4\n", ""]))  # fmt: skip
def test_whatif_traces_mutated(tmp_path_factory, cells, text_col, drop, meta) -> None:
    folder = tmp_path_factory.mktemp("wia")
    frame = WIA.copy()
    for row, col, value in cells:
        frame[col] = frame[col].astype(object)
        frame.iat[row, frame.columns.get_loc(col)] = value
    if text_col:  # astype(str) fails on a lone surrogate where pandas' str dtype is pyarrow's
        frame[text_col] = frame[text_col].map(lambda v: str(v).encode("utf-8", "replace").decode())
    if drop:
        frame = frame.drop(columns=[drop])
    for col in frame.columns:  # parquet wants one type a column
        if frame[col].dtype == object:
            frame[col] = frame[col].map(
                lambda v: (v if isinstance(v, str) else repr(v)).encode("utf-8", "replace").decode()
            )
    frame.to_parquet(folder / "trace-AR.parquet")
    if meta:
        (folder / "meta-AR.yaml").write_text(meta)
    _good(folder)
    result, store = check_import([str(folder)])
    _kept_the_good_one(result, store, "trace-AR.parquet")


LOG_SEEDS = sorted(
    p for p in glob.glob(os.path.join(CORPUS, "*", "*")) if not p.endswith(("case.json", ".md"))
)


@FUZZ
@given(path=st.sampled_from(LOG_SEEDS), edits=st.lists(st.tuples(st.integers(0, 10**6), nasty),
                                                      max_size=6))  # fmt: skip
def test_text_logs_mutated_through_the_import(tmp_path_factory, path, edits) -> None:
    folder = tmp_path_factory.mktemp("log")
    text = open(path, encoding="utf-8", errors="replace").read()[:20000]
    for at, value in edits:
        at %= len(text) + 1
        text = text[:at] + str(value) + text[at:]
    (folder / f"rank{1 << 40}.log").write_text(text, encoding="utf-8", errors="surrogateescape")
    _good(folder)
    check_import([str(folder)])


@pytest.mark.parametrize("seed", range(len(FR_SEEDS)))
def test_the_seeds_themselves_import(tmp_path, seed) -> None:
    """The unmutated seeds import cleanly (the fuzz tests start from good input)."""
    (tmp_path / "nccl_trace_rank_2").write_bytes(pickle.dumps(FR_SEEDS[seed]))
    result, store = check_import([str(tmp_path)])
    assert [f.ok for f in result.files] == [True] and store.rows["fr_entries"] == 12
