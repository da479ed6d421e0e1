"""The Flight Recorder reader and ingest on real dumps: NCCL on 2x H200 and gloo here
(tests/data/fr), and schema 2.9 dumps of a 16-rank run (tests/data/realdata)."""

from __future__ import annotations

import glob
import gzip
import json
import math
import os
import pickle
import shutil
import subprocess
import sys
import time
from collections import Counter

import pytest

from ranksight.collectors.base import NodeContext, frame
from ranksight.collectors.flight_recorder import normalize_entry, parse, read_dump
from ranksight.collectors.fr_ingest import FrCollector, dump_rows
from tests.helpers.realdata import realdata

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FR = os.path.join(TESTS, "data", "fr")


def raw(name: str) -> bytes:
    with open(os.path.join(FR, name), "rb") as f:
        return gzip.decompress(f.read())


def test_nccl_dumps_from_the_gpu_machine() -> None:
    d = read_dump(os.path.join(FR, "nccl_h200x2", "train_rank0.pkl.gz"))
    assert (d.format, d.version, d.comm_lib_version, d.rank, d.problems) == (
        "pickle",
        "2.10",
        "2.28.9",
        0,
        (),
    )
    ops = Counter(e["op"] for e in d.entries)
    assert {"nccl:all_reduce", "nccl:broadcast", "nccl:send 0->1"} <= set(ops)
    assert all(e["state"] == "completed" for e in d.entries)
    timed = [e["duration_ms"] for e in d.entries if not math.isnan(e["duration_ms"])]
    assert len(timed) > 0.95 * len(d.entries) and min(timed) > 0, (
        "TORCH_NCCL_ENABLE_TIMING=1: timed"
    )
    e = next(e for e in d.entries if e["op"] == "nccl:send 0->1")
    assert (
        e["is_p2p"] == 1
        and e["time_completed_ns"] >= e["time_started_ns"] >= e["time_created_ns"] > 0
    )
    assert json.loads(e["frames"])[-1][1].endswith("fr_job.py")
    j = read_dump(os.path.join(FR, "nccl_h200x2", "train_rank1.json.gz"))
    assert (j.format, j.version, j.rank, j.problems) == ("json", "2.10", 1, ())
    assert len(j.entries) == len(d.entries) and j.entries[0]["frames"] == "[]", (
        "JSON dumps carry no stacks"
    )


def test_nccl_dump_on_timeout_shows_the_rank_that_never_joined() -> None:
    r0 = read_dump(os.path.join(FR, "nccl_h200x2", "nccl_trace_rank_0.gz"))
    r1 = read_dump(os.path.join(FR, "nccl_h200x2", "nccl_trace_rank_1.gz"))
    assert (r0.rank, r1.rank, r0.problems, r1.problems) == (0, 1, (), ())
    last0, last1 = r0.entries[-1], r1.entries[-1]
    assert (last0["op"], last0["state"], last0["time_completed_ns"]) == (
        "nccl:all_reduce",
        "started",
        0,
    )
    assert last1["state"] == "completed", "rank 1 went on and never issued it"
    default = r0.pg_status["0"]
    assert default["last_started_collective"] > default["last_completed_collective"]
    assert r0.pg_config["0"]["ranks"] == "[0, 1]"


def test_gloo_dumps_from_here() -> None:
    p = read_dump(os.path.join(FR, "gloo_cpu", "fr_gloo_rank0.pkl.gz"))
    j = read_dump(os.path.join(FR, "gloo_cpu", "fr_gloo_rank1.json.gz"))
    for d in (p, j):
        assert (d.version, d.problems) == ("2.10", ())
        assert set(Counter(e["op"] for e in d.entries)) == {
            "gloo:all_reduce",
            "gloo:broadcast",
            "gloo:all_gather",
            "gloo:barrier",
        }
        assert all(e["time_started_ns"] == 0 and math.isnan(e["duration_ms"]) for e in d.entries), (
            "gloo: no device times"
        )
    assert json.loads(p.entries[0]["frames"]), "pickle dumps carry stacks"


def test_schema_2_9_dumps_of_a_16_rank_run() -> None:
    paths = sorted(glob.glob(os.path.join(realdata("nvrx_fr_dumps", "gpu_error_1st"), "_dump_*")))
    dumps = [read_dump(p) for p in paths]
    assert sorted(d.rank for d in dumps) == list(range(16))
    for d in dumps:
        assert (d.version, d.comm_lib_version, d.problems) == ("2.9", "2.27.3", ())
        assert d.entries and all(e["state"] == "scheduled" for e in d.entries)
    recv = next(e for d in dumps for e in d.entries if e["op"].startswith("nccl:recv"))
    assert recv["is_p2p"] == 1 and recv["pg_desc"] == "PIPELINE_MODEL_PARALLEL_GROUP"


@pytest.mark.parametrize(
    "name", ["nccl_h200x2/nccl_trace_rank_0.gz", "nccl_h200x2/train_rank1.json.gz"]
)
def test_a_truncated_dump_keeps_the_entries_before_the_cut(name) -> None:
    data = raw(name)
    whole = [e["record_id"] for e in parse(data).entries]
    kept = []
    for fraction in (0.05, 0.3, 0.6, 0.95):
        d = parse(data[: int(len(data) * fraction)], source=name)
        ids = [e["record_id"] for e in d.entries]
        assert ids == whole[: len(ids)], "a prefix of the whole dump, in order"
        assert any("damaged" in p for p in d.problems)
        kept.append(len(ids))
    assert kept == sorted(kept) and 0 < kept[-1] < len(whole)


def test_empty_foreign_and_unknown_version_dumps(tmp_path) -> None:
    empty = tmp_path / "nccl_trace_rank_3"
    empty.write_bytes(b"")
    d = read_dump(str(empty))
    assert (d.rank, d.entries, d.problems) == (3, (), ("the file is empty",))
    assert "neither pickle nor JSON" in parse(b"NCCL INFO ...").problems[0]
    assert "no 'entries'" in parse(pickle.dumps({"version": "2.10"})).problems[0]
    assert "refused to load" in parse(pickle.dumps(tmp_path)).problems[0], "no classes from a dump"
    top = pickle.loads(raw("nccl_h200x2/nccl_trace_rank_1.gz"))
    top["version"] = "3.0"
    d = parse(pickle.dumps(top))
    assert len(d.entries) == len(top["entries"]) and "unknown schema version '3.0'" in d.problems[0]
    assert "cannot read" in read_dump(str(tmp_path / "missing")).problems[0]


def test_older_key_names() -> None:
    top = pickle.loads(raw("nccl_h200x2/train_rank0.pkl.gz"))
    e = next(
        e
        for e in top["entries"]
        if e["profiling_name"] == "nccl:recv 1<-0" or e["profiling_name"] == "nccl:send 0->1"
    )
    old = {
        k: v
        for k, v in e.items()
        if k not in ("collective_seq_id", "is_p2p", "thread_name", "input_dtypes", "timeout_ms")
    }
    old["seq_id"] = e["collective_seq_id"]
    n = normalize_entry(old)
    assert n["collective_seq_id"] == e["collective_seq_id"] and n["is_p2p"] == 1
    assert (n["input_dtypes"], n["thread_name"], n["timeout_ms"]) == ("[]", "", 0)
    assert normalize_entry({"record_id": 1}) is None


def test_dumps_into_the_store(store) -> None:
    d = read_dump(os.path.join(FR, "nccl_h200x2", "nccl_trace_rank_0.gz"))
    rows = dump_rows(d, run_id="r1", attempt=2, host="vm", ts_ns=time.time_ns())
    for table, items in rows.items():
        store.insert(table, frame(table, items))
    head = store.query("SELECT rank, version, comm_lib_version, entries FROM fr_dumps").to_dict(
        "records"
    )
    assert head == [
        {"rank": 0, "version": "2.10", "comm_lib_version": "2.28.9", "entries": len(d.entries)}
    ]
    stuck = store.query(
        "SELECT op, collective_seq_id AS seq FROM fr_entries WHERE run_id = %(r)s AND state = 'started'",
        {"r": "r1"},
    ).to_dict("records")
    assert stuck == [{"op": "nccl:all_reduce", "seq": d.entries[-1]["collective_seq_id"]}]


def test_collector_takes_stable_dumps_once_and_again_when_they_change(tmp_path) -> None:
    prefix = str(tmp_path / "fr" / "nccl_trace_rank_")
    os.makedirs(os.path.dirname(prefix))
    spool = tmp_path / "spool" / "run-x" / "a1"
    spool.mkdir(parents=True)
    (spool / f"rank00001-{os.getpid()}.jsonl").write_text("{}\n")
    ctx = NodeContext(host="n1", spool_dir=str(tmp_path / "spool"))
    c = FrCollector(ctx, prefixes=(prefix,))
    c.open()
    shutil.copy(os.path.join(FR, "nccl_h200x2", "nccl_trace_rank_1.gz"), prefix + "1")
    shutil.copy(os.path.join(FR, "nccl_h200x2", "nccl_trace_rank_0.gz"), prefix + "0.tmp4242")
    assert c.collect(1) == {}, "first sight: wait until it stops changing"
    rows = c.collect(2)
    (head,) = rows["fr_dumps"]
    assert (head["run_id"], head["attempt"], head["rank"], head["source"]) == (
        "run-x",
        1,
        1,
        prefix + "1",
    )
    assert len(rows["fr_entries"]) == head["entries"] > 0
    assert c.collect(3) == {}
    again = FrCollector(ctx, prefixes=(prefix,))
    again.open()
    assert again.collect(4) == {} and again.collect(5) == {}, (
        "an agent restart does not take it twice"
    )
    shutil.copy(os.path.join(FR, "nccl_h200x2", "nccl_trace_rank_0.gz"), prefix + "1")
    again.collect(6)
    assert len(again.collect(7)["fr_dumps"]) == 1, "a rank dumping again is taken again"


def test_fr_import_command(tmp_path) -> None:
    store = f"chdb://{tmp_path / 'store'}"
    out = subprocess.run(
        [sys.executable, "-m", "ranksight.cli", "fr-import", "--run", "r9", "--store", store,
         os.path.join(FR, "gloo_cpu", "fr_gloo_rank0.pkl.gz"), str(tmp_path / "nccl_trace_rank_5")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 1, out.stderr  # one of the two could not be read
    assert "rank 0, version 2.10, 1491 entries: ok" in out.stdout  # the other is stored
    assert "nccl_trace_rank_5: not stored: cannot read the file" in out.stderr
    assert "1 of 2 files could not be read" in out.stderr
