"""``ranksight import`` (a real CLI process) on a folder where a good real Flight Recorder
dump lies beside a bad file of every kind: the exit code is the report's on the good
dump (``import --help``), each bad file is named on one line, every row of the good dump
is stored with a ``runs`` row, and an import of bad files only stores nothing at all. A
dump whose numbers overflow their columns (SeqNum past UInt64, record ids past Int64) is
read with them as unknown: its rows are stored, never a traceback that stores nothing or
leaves rows without a run."""

from __future__ import annotations

import gzip
import json
import os
import pickle
import shutil
import subprocess
import sys

import pandas as pd
import pytest

from ranksight.collectors.flight_recorder import read_dump
from ranksight.store import open_store

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOOD = os.path.join(TESTS, "data", "fr", "nccl_h200x2", "nccl_trace_rank_0.gz")
TABLES = ("runs", "ranks", "collectives", "progress", "fr_dumps", "fr_entries", "stacks",
          "log_events", "steps", "phases")  # fmt: skip


def bad_files(folder) -> list[str]:
    """One file of each kind that its reader must refuse (types a reader does not expect)."""
    (folder / "nccl_trace_rank_1").write_bytes(
        pickle.dumps({"version": [2, 10], "entries": 5, "pg_config": 7, "pg_status": "x"})
    )
    (folder / "trace.json").write_text(json.dumps({
        "distributedInfo": {"rank": [1]},
        "traceEvents": [{"ph": "X", "cat": "kernel", "name": "ncclKernel_AllReduce", "ts": 1,
                         "dur": 1, "args": {"In msg nelems": [3]}}]}))  # fmt: skip
    (folder / "rank2.txt").write_text(json.dumps([{"thread_name": 1, "frames": 7}, 3]))
    pd.DataFrame({c: ["x"] for c in ("dp_rank", "stage", "rank", "step", "optype", "start_ts",
                                     "duration", "seq_id")}).to_parquet(folder / "trace-AR.parquet")  # fmt: skip
    return ["nccl_trace_rank_1", "trace.json", "rank2.txt", "trace-AR.parquet"]


def overflowing(path) -> str:
    """A real dump (rank 1 of the same job) whose numbers no column holds."""
    with open(GOOD.replace("rank_0", "rank_1"), "rb") as f:
        doc = pickle.loads(gzip.decompress(f.read()))
    for i, e in enumerate(doc["entries"]):
        e.update(collective_seq_id=(1 << 64) + i, record_id=(1 << 70) + i, op_id=-(1 << 65))
    doc["pg_status"]["0"]["last_completed_collective"] = 1 << 65
    path.write_bytes(pickle.dumps(doc))
    return str(path)


def cli(*args, store) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ranksight.cli", "import", *args, "--store", store],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def rows_of(store: str, run: str, where: str = "", tables=TABLES) -> dict[str, int]:
    s = open_store(store)
    return {t: int(s.query(f"SELECT count() AS n FROM {t} WHERE run_id = %(r)s {where}",
                           {"r": run})["n"].iloc[0]) for t in tables}  # fmt: skip


@pytest.fixture(scope="module")
def imports(tmp_path_factory):
    """(good alone, good + bad, bad alone) imports into one store."""
    root = tmp_path_factory.mktemp("bad")
    store = str(root / "store")
    alone, mixed, only_bad = root / "alone", root / "mixed", root / "only_bad"
    for f in (alone, mixed, only_bad):
        f.mkdir()
    shutil.copy(GOOD, alone)
    shutil.copy(GOOD, mixed)
    names = bad_files(mixed)
    bad_files(only_bad)
    over = overflowing(root / "nccl_trace_rank_2")
    out = {
        "alone": cli(str(alone), "--run", "alone", "--format", "json", store=store),
        "mixed": cli(str(mixed), "--run", "mixed", "--format", "json", store=store),
        "bad": cli(str(only_bad), "--run", "bad", store=store),
        "over": cli(str(mixed), over, "--run", "over", "--no-report", store=store),
        "over_alone": cli(over, "--run", "over_alone", "--no-report", store=store),
    }
    return store, names, out


def test_each_bad_file_named_on_one_line_and_the_exit_code_is_the_reports(imports) -> None:
    _, names, out = imports
    assert out["alone"].returncode in (0, 3), out["alone"].stderr
    assert out["mixed"].returncode == out["alone"].returncode, out["mixed"].stderr
    assert "Traceback" not in out["mixed"].stderr
    lines = out["mixed"].stderr.splitlines()
    for name in names:
        mine = [line for line in lines if name in line]
        assert len(mine) == 1 and mine[0].startswith("error: could not import "), (name, lines)
        assert "cannot be read (" not in mine[0], mine[0]  # a reader's own words, no exception name
    assert (
        json.loads(out["mixed"].stdout)["findings"] == json.loads(out["alone"].stdout)["findings"]
    )


def test_every_row_of_the_good_dump_is_stored_with_its_run(imports) -> None:
    store, _, _ = imports
    alone, mixed = rows_of(store, "alone"), rows_of(store, "mixed")
    assert mixed["runs"] == 1 and mixed == alone
    assert mixed["fr_entries"] == len(read_dump(GOOD).entries) > 1000


def test_only_bad_files_leave_no_row_and_exit_1(imports) -> None:
    store, names, out = imports
    assert out["bad"].returncode == 1, out["bad"].stderr
    assert "nothing could be imported" in out["bad"].stderr
    assert all(n in out["bad"].stderr for n in names)
    assert rows_of(store, "bad") == dict.fromkeys(TABLES, 0)


def test_a_dump_of_overflowing_numbers_is_stored_beside_the_good_one(imports) -> None:
    store, _, out = imports
    assert out["over"].returncode == 0 and "Traceback" not in out["over"].stderr, out["over"].stderr
    line = [x for x in out["over"].stdout.splitlines() if "nccl_trace_rank_2" in x]
    assert len(line) == 1 and "flight_recorder rank 2" in line[0], out["over"].stdout
    over, alone = rows_of(store, "over"), rows_of(store, "alone")
    assert over["runs"] == 1
    assert over["fr_entries"] == alone["fr_entries"] + len(
        read_dump(GOOD.replace("rank_0", "rank_1")).entries
    )
    per_rank = ("collectives", "progress", "fr_dumps", "fr_entries")
    good = rows_of(store, "over", "AND rank = 0", per_rank)
    assert good == rows_of(store, "alone", "AND rank = 0", per_rank)
    seqs = open_store(store).query(
        "SELECT max(collective_seq_id) AS s FROM fr_entries WHERE run_id = 'over' AND rank = 2"
    )
    assert int(seqs["s"].iloc[0]) == -1, "a SeqNum past the column is unknown"


def test_only_a_dump_of_overflowing_numbers_still_gets_its_run(imports) -> None:
    store, _, out = imports
    assert out["over_alone"].returncode == 0, out["over_alone"].stderr
    rows = rows_of(store, "over_alone")
    assert rows["runs"] == 1 and rows["fr_entries"] > 1000
