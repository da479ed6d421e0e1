"""``ranksight import`` on real artifacts (tests/data/realdata, see its MANIFEST.md) and on
dumps and traces of real gloo runs here (tests/data/import): the report's culprit and
cause must be the known answer."""

from __future__ import annotations

import gzip
import json
import os
import pickle
import shutil
import subprocess
import sys
import tarfile
import zipfile

import pandas as pd
import pytest

from ranksight.analyzer import analyze
from ranksight.analyzer.whatif import replay, whatif_slowdown
from ranksight.importer import ImportConfig, import_paths, sniff
from ranksight.store import open_store
from ranksight.ui.data.runs import run_status
from tests.helpers.realdata import realdata

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(TESTS, "data", "import")


@pytest.fixture
def chdb(tmp_path):
    store = open_store(str(tmp_path / "store"))
    store.init_schema()
    return store


def run(store, *paths, run_id="r"):
    result = import_paths(store, list(paths), ImportConfig(run_id=run_id))
    return result, analyze(store, run_id)


def culprits(analysis, kind=None):
    return {f.culprit_rank for f in analysis.findings if kind is None or f.kind == kind}


def stored_status(store, run_id="r") -> str:
    return store.query("SELECT status FROM runs WHERE run_id = %(r)s", {"r": run_id})[
        "status"
    ].iloc[-1]


def answer(folder: str) -> dict:
    with open(os.path.join(folder, "ANSWER.json")) as f:
        return json.load(f)


@pytest.mark.parametrize("case", ["gpu_error_1st", "gpu_error_2nd"])
def test_flight_recorder_every_injected_rank(chdb, case) -> None:
    folder = realdata("nvrx_fr_dumps", case)
    with open(os.path.join(folder, "fault_injection.log")) as f:
        injected = {int(x) for x in f.readline().split("[")[1].split("]")[0].split(",")}
    result, analysis = run(chdb, folder)
    assert len([f for f in result.files if f.kind == "flight_recorder"]) == 16
    assert culprits(analysis, "hang") == injected
    assert {f.cause for f in analysis.findings} == {"stopped_completing"}


def test_flight_recorder_missing_dumps_say_what_is_undecided(chdb, tmp_path) -> None:
    folder = tmp_path / "some"
    folder.mkdir()
    for r in range(16):
        if r not in (13, 15):
            shutil.copy(realdata("nvrx_fr_dumps", "gpu_error_1st", f"_dump_{r}"), folder)
    _, analysis = run(chdb, str(folder))
    # rank 14 was told apart by 13 and 15 completing what it did not: without their dumps
    # that cannot be decided, and no innocent rank is named instead
    assert culprits(analysis, "hang") == {12}
    assert any("13,15" in n and "cannot be decided" in n for n in analysis.notes)


def test_watchdog_desync(chdb) -> None:
    folder = realdata("handed", "watchdog_desync_4r")
    _, analysis = run(chdb, folder)
    want = answer(folder)
    desync = [f for f in analysis.findings if f.kind == "desync"]
    assert [f.culprit_rank for f in desync] == want["culprit_ranks"]
    assert desync[0].evidence["seq"] == want["seq"]
    assert culprits(analysis) == set(want["culprit_ranks"])


def test_watchdog_missing_rank(chdb) -> None:
    folder = realdata("handed", "watchdog_missing_rank_8r")
    _, analysis = run(chdb, folder)
    want = answer(folder)
    assert culprits(analysis) == set(want["culprit_ranks"])
    (f,) = analysis.findings
    assert f.kind == "hang" and f.evidence["seq"] == want["seq"]
    assert stored_status(chdb) == "failed"  # the watchdog timed the collective out


def test_pyspy_loader_stall(chdb) -> None:
    folder = realdata("handed", "pyspy_loader_stall_8r")
    _, analysis = run(chdb, folder)
    assert culprits(analysis) == set(answer(folder)["culprit_ranks"])
    assert analysis.findings[0].cause == "data_loader"


def test_nccl_debug_lagging_rank(chdb) -> None:
    folder = realdata("handed", "nccl_debug_lagging_4r")
    _, analysis = run(chdb, folder)
    assert culprits(analysis) == set(answer(folder)["culprit_ranks"])
    assert analysis.findings[0].evidence["issued"] == 179  # 180 calls, opCount 0..0xb3


def test_import_summary_comm_time_and_nccl_topology(chdb) -> None:
    from ranksight.importer.summary import summary_lines

    result, _ = run(
        chdb,
        realdata("handed", "nccl_debug_lagging_4r"),
        realdata("kineto_hta", "nccl_parser_config_nccl_data.json.gz"),
    )
    lines = summary_lines(result.meta)
    assert lines[0].startswith("communication time per collective type")
    assert "all_reduce 15 kernels" in lines[0] and "broadcast 6 kernels" in lines[0]
    assert [x.split(" NCCL:")[0] for x in lines[1:]] == [f"rank {r}" for r in range(4)]
    assert all("NCCL version 2.21.5" in x for x in lines[1:])


def test_wia_worker_straggler_and_whatif(chdb) -> None:
    with open(realdata("wia_AR", "result-AR.json")) as f:
        published = json.load(f)["blocking_slowdown"]
    _, analysis = run(chdb, realdata("wia_AR"))
    (f,) = [f for f in analysis.findings if f.kind == "straggler"]
    assert (f.culprit_rank, f.dp, f.pp, f.cause) == (0, 0, 0, "compute")
    s = f.evidence["whatif"]["slowdown"]
    assert abs(s - published) / published < 0.05, s
    assert f.evidence["worker_or_stage"]["verdict"] == "worker"
    assert f.evidence["worker_or_stage"]["stage_slowdown"] < 1.1
    # the replay reproduces the measured step (0.5% off): that, not the impact, is its error
    misfit = f.evidence["whatif"]["misfit_pct"]
    assert misfit < 5 and f.evidence["impact_error_pts"] == misfit, f.evidence


def test_kineto_healthy_baselines(chdb) -> None:
    folder = realdata("kineto_hta")
    _, a = run(chdb, os.path.join(folder, "nccl_parser_config_nccl_data.json.gz"), run_id="one")
    assert a.findings == [] and a.steps_analyzed == 2
    ranks = [os.path.join(folder, f"trace_filter_sampled_rank-{r}.json.gz") for r in (0, 1)]
    result, b = run(chdb, *ranks, run_id="two")
    assert b.findings == []
    assert result.rows["collectives"] == 20 and result.rows["steps"] == 4
    coll = chdb.query("SELECT op, numel_in, group_ranks FROM collectives WHERE run_id = 'one'")
    assert set(coll["op"]) == {"all_reduce", "broadcast"} and coll["numel_in"].max() > 0
    assert set(coll["group_ranks"]) == {"0,1"}  # from the kernels' metadata


def test_kineto_compute_spilled_to_disk_gives_the_same_rows(tmp_path) -> None:
    """Kernel times beyond the read chunk go to a file as they are read (memory bound):
    the per-step compute must equal that of a read holding them all."""
    from ranksight.importer import kineto

    path = realdata("kineto_hta", "nccl_parser_config_nccl_data.json.gz")
    whole = kineto.read(path, 0)
    spill = str(tmp_path / "c.f64")
    cut = kineto.read(path, 0, chunk=160, spill=spill)  # 10 pairs held at most
    assert cut.spilled == whole.compute_count == 2679 and len(cut.compute) == 0
    assert os.path.getsize(spill) == 2679 * 16
    a, b = kineto.rank_rows(whole, [0]), kineto.rank_rows(cut, [0])
    assert a.tables["phases"] == b.tables["phases"] and len(a.tables["phases"]) == 3


def test_kineto_two_jobs_one_rank_is_refused_per_file(chdb) -> None:
    result, _ = run(chdb, realdata("kineto_hta"))
    bad = result.failed
    assert len(bad) == 1 and "already imported" in bad[0].message
    assert len(result.imported) == 2


def test_gloo_hang_flight_recorder(chdb) -> None:
    _, analysis = run(chdb, os.path.join(DATA, "gloo_hang"))
    (f,) = analysis.findings
    assert (f.kind, f.culprit_rank, f.cause) == ("hang", 1, "stuck")


FR_NCCL = os.path.join(TESTS, "data", "fr", "nccl_h200x2")


def test_nccl_timeout_dumps_rank_that_never_joined(chdb, tmp_path) -> None:
    """Dumps NCCL's watchdog wrote at a timeout on 2x H200 (schema 2.10): the default
    group mixes collectives and send/recv, so pg_status counts in both sequences (rank 0:
    enqueued 873, completed 97); the entries say rank 1 never issued all_reduce #873."""
    folder = tmp_path / "in"
    folder.mkdir()
    for r in (0, 1):
        shutil.copy(os.path.join(FR_NCCL, f"nccl_trace_rank_{r}.gz"), folder)
    _, analysis = run(chdb, str(folder))
    (f,) = analysis.findings
    assert (f.kind, f.culprit_rank) == ("hang", 1)
    e = f.evidence
    assert (e["seq"], e["op"], e["issued"], e["waiting"]) == (873, "all_reduce", 872, [0])
    assert "rank 0 is blocked in it" in f.summary
    p = chdb.query(
        "SELECT rank, direction, issued_seq, completed_seq FROM progress "
        "WHERE run_id = 'r' AND group_id = 'default_pg[0,1]' ORDER BY rank, direction"
    )
    got = [tuple(int(x) if i != 1 else x for i, x in enumerate(row)) for row in p.values]
    assert got == [(0, "", 873, 872), (0, "p2p", 97, 97), (1, "", 872, 872), (1, "p2p", 97, 97)]


def test_cut_short_dump_is_undecided_not_blamed(chdb, tmp_path) -> None:
    """Rank 0's dump cut at 20 kB keeps its oldest 650 entries: it must not read as rank 0
    having stopped at #488 (rank 1, the rank that never joined, is then undecided too)."""
    folder = tmp_path / "in"
    folder.mkdir()
    with open(os.path.join(FR_NCCL, "nccl_trace_rank_0.gz"), "rb") as f:
        (folder / "nccl_trace_rank_0.gz").write_bytes(f.read()[:20_000])
    shutil.copy(os.path.join(FR_NCCL, "nccl_trace_rank_1.gz"), folder)
    result, analysis = run(chdb, str(folder))
    (cut,) = [f for f in result.files if f.rank == 0]
    assert cut.ok and "damaged" in cut.message
    assert analysis.findings == []
    assert any(n.startswith("rank 0's Flight Recorder dump is cut short") for n in analysis.notes)


def test_nccl_healthy_dumps_no_finding(chdb, tmp_path) -> None:
    folder = tmp_path / "in"
    folder.mkdir()
    for name in ("train_rank0.pkl.gz", "train_rank1.json.gz"):
        shutil.copy(os.path.join(FR_NCCL, name), folder)
    result, analysis = run(chdb, str(folder))
    assert [(f.kind, f.rank) for f in result.imported] == [
        ("flight_recorder", 0),
        ("flight_recorder", 1),
    ]
    assert analysis.findings == []
    assert stored_status(chdb) == "finished"  # dumps of a healthy job: not a failed run


def test_gloo_slow_kineto_and_fr_mixed(chdb) -> None:
    result, analysis = run(chdb, os.path.join(DATA, "gloo_slow"))
    assert {f.kind for f in result.files} == {"kineto", "flight_recorder"}
    (f,) = analysis.findings
    assert (f.kind, f.culprit_rank, f.cause) == ("straggler", 1, "compute")
    assert f.evidence["whatif"]["slowdown"] > 1.5


def test_nccl_slow_kineto_and_fr_one_row_per_collective(chdb) -> None:
    """2x H200, NCCL, ``slow:rank=1,factor=3,from_step=2``: CUDA Kineto traces of steps
    2-7 and Flight Recorder dumps of the same default group. The kernels take the dumps'
    sequence numbers (no second row per collective, no desync), and rank 1's step time
    outside NCCL kernels (its GPU idles while its host computes slowly) names it."""
    result, analysis = run(chdb, os.path.join(DATA, "nccl_slow"))
    assert {f.kind for f in result.imported} == {"kineto", "flight_recorder"}
    assert result.rows["collectives"] == 104  # 52 dump entries per rank, kernels merged in
    (f,) = analysis.findings
    assert (f.kind, f.culprit_rank, f.cause) == ("straggler", 1, "compute")
    assert 2.0 < f.evidence["median_ratio"] < 4.0
    coll = chdb.query(
        "SELECT rank, group_seq, step, count() AS n FROM collectives WHERE run_id = 'r' "
        "GROUP BY rank, group_seq, step"
    )
    assert coll["n"].max() == 1
    # the kernels of steps 2-7 sit at the dumps' #11-#40 (5 all_reduces a step, from #1)
    for rank in (0, 1):
        mine = coll[coll["rank"] == rank]
        assert sorted(mine.loc[mine["step"] >= 0, "group_seq"]) == list(range(11, 41))
        assert set(mine.loc[mine["group_seq"] == 11, "step"]) == {2}


def test_nccl_hang_flight_recorder(chdb) -> None:
    """2x H200, NCCL, ``hang:rank=1,from_step=4``: dumps 45 s in."""
    _, analysis = run(chdb, os.path.join(DATA, "nccl_hang"))
    (f,) = analysis.findings
    assert (f.kind, f.culprit_rank, f.cause) == ("hang", 1, "stuck")
    assert f.evidence["waiting"] == [0] and f.evidence["issued"] < f.evidence["others_issued"]
    # the dumps alone do not say the job died; the Runs page shows it hung by the finding
    assert stored_status(chdb) == "finished"
    assert run_status("finished", 0, 0.0, hang_findings=1, now_ns=0, hang_after_s=60) == "hung"


def test_merge_takes_the_offset_kernels_start_after_their_entries() -> None:
    """A periodic pattern matches at every period; only the right offset has no kernel
    starting before its entry was created, and the earliest start wins among those."""
    from ranksight.importer import merge

    ms = 1_000_000
    sizes = [10, 20, 20]  # one step's collectives, repeated
    entries = {
        s: {"rank": 0, "group_id": "g[0,1]", "group_seq": s, "op": "all_reduce",
            "numel_in": sizes[(s - 1) % 3], "enqueue_ns": s * 100 * ms, "start_ns": 0,
            "end_ns": 0, "step": -1}
        for s in range(1, 13)
    }  # fmt: skip
    kernels = [
        {"rank": 0, "group_id": "g[0,1]", "group_seq": i, "op": "all_reduce",
         "numel_in": sizes[i % 3], "start_ns": (4 + i) * 100 * ms + (0 if i == 0 else 90 * ms),
         "end_ns": (4 + i) * 100 * ms + 95 * ms, "step": 1 + i // 3}
        for i in range(6)
    ]  # fmt: skip
    assert merge.offset(kernels, entries) == 4
    index = merge.fr_index(list(entries.values()))
    assert merge.merge_kineto(kernels, index) == []
    assert entries[4]["step"] == 1 and entries[9]["step"] == 2 and entries[4]["start_ns"] > 0
    wrong = [{**k, "numel_in": 99} for k in kernels]  # fits no offset: kept apart
    out = merge.merge_kineto(wrong, merge.fr_index(list(entries.values())))
    assert len(out) == 6 and {k["group_id"] for k in out} == {"g~kineto[0,1]"}


def test_mixed_inputs_one_run(chdb) -> None:
    _, analysis = run(
        chdb,
        realdata("handed", "pyspy_loader_stall_8r"),
        realdata("handed", "watchdog_missing_rank_8r"),
    )
    assert culprits(analysis) == {0, 6}


def test_archive_input(chdb, tmp_path) -> None:
    archive = tmp_path / "dumps.tar.gz"
    with tarfile.open(archive, "w:gz") as t:
        t.add(realdata("nvrx_fr_dumps", "gpu_error_2nd"), arcname="dumps")
    _, analysis = run(chdb, str(archive))
    assert culprits(analysis) == {9, 14}


def test_bad_files_named_and_the_rest_imported(chdb, tmp_path) -> None:
    folder = tmp_path / "in"
    shutil.copytree(os.path.join(DATA, "gloo_slow"), folder)
    with gzip.open(folder / "kineto_rank1.json.gz") as f:
        data = f.read()
    (folder / "kineto_rank1.json.gz").unlink()
    (folder / "kineto_rank1.json").write_bytes(data[: len(data) // 2])  # truncated
    (folder / "fr_rank1.json.gz").unlink()
    (folder / "fr_rank1.json").write_text('{"version": "9.1", "pg_config": {}, "entries": []}')
    (folder / "trace_rank3.json").write_text('{"traceEvents": 5}')
    result, _ = run(chdb, str(folder))
    by = {os.path.basename(f.path): f for f in result.files}
    assert by["kineto_rank1.json"].ok and "truncated" in by["kineto_rank1.json"].message
    assert "unknown schema version '9.1'" in by["fr_rank1.json"].message
    assert not by["trace_rank3.json"].ok and "trace_rank3" in by["trace_rank3.json"].path
    assert by["kineto_rank0.json.gz"].ok and by["fr_rank0.json.gz"].ok


def test_store_inside_the_input_folder_is_not_read(tmp_path) -> None:
    folder = tmp_path / "in"
    shutil.copytree(os.path.join(DATA, "gloo_hang"), folder)
    (folder / ".notes").write_text("WorkNCCL(SeqNum=1, OpType=ALLREDUCE) timeout")
    shutil.copytree(realdata("handed", "watchdog_desync_4r"), folder / ".cache")
    store = open_store(str(folder / "store"))
    store.init_schema()
    other = open_store(str(folder / "old" / "store"))
    other.init_schema()
    import_paths(other, [os.path.join(DATA, "gloo_hang")], ImportConfig(run_id="old"))
    for run_id in ("a", "b"):  # the second time the store holds Parquet segments
        result, analysis = run(store, str(folder), run_id=run_id)
        assert result.failed == []
        assert [os.path.basename(f.path) for f in result.imported] == [
            "fr_rank0.json",
            "fr_rank1.json",
        ]
        skipped = {os.path.relpath(f.path, folder): f.message for f in result.files if not f.kind}
        assert skipped == {
            "store": "skipped: the store being imported into",
            os.path.join("old", "store"): "skipped: a ranksight store, not an artifact",
        }
        assert culprits(analysis) == {1}
    named = import_paths(store, [str(folder / "store" / "runs")], ImportConfig(run_id="c"))
    assert not named.imported and "store being imported into" in named.failed[0].message
    assert store.query("SELECT count() AS n FROM runs WHERE run_id = 'c'")["n"].iloc[0] == 0


def test_archive_by_content_and_named_by_member(chdb, tmp_path) -> None:
    folder = tmp_path / "in"
    folder.mkdir()
    with tarfile.open(folder / "from_the_cluster.bin", "w:gz") as t:
        t.add(os.path.join(DATA, "gloo_hang"), arcname="dumps")
    # a torch.save checkpoint is a zip: not unpacked, not an artifact
    with zipfile.ZipFile(folder / "model.pt", "w") as z:
        z.writestr("model/data.pkl", pickle.dumps({"w": 1}))
        z.writestr("model/version", "3\n")
    result, analysis = run(chdb, str(folder))
    names = sorted(f.path for f in result.imported)
    archive = str(folder / "from_the_cluster.bin")
    assert names == [f"{archive}:dumps/fr_rank0.json", f"{archive}:dumps/fr_rank1.json"]
    (pt,) = [f for f in result.files if f.path.endswith("model.pt")]
    assert pt.ok and pt.kind is None and pt.message.startswith("skipped")
    assert culprits(analysis) == {1}


def test_foreign_pickle_is_no_rank_dump(chdb, tmp_path) -> None:
    """A pickle or JSON that is no Flight Recorder dump is refused by name; taken as rank
    2's dump it would say rank 2 issued nothing and blame it for the hang."""
    folder = tmp_path / "in"
    shutil.copytree(os.path.join(DATA, "gloo_hang"), folder)
    (folder / "stats_rank2.pkl").write_bytes(pickle.dumps({"loss": [1.0, 0.5]}))
    (folder / "config_rank3.json").write_text('{"entries": 5, "lr": 0.1}')
    result, analysis = run(chdb, str(folder))
    bad = {os.path.basename(f.path): f.message for f in result.failed}
    assert set(bad) == {"stats_rank2.pkl", "config_rank3.json"}
    assert all("not a Flight Recorder dump" in m for m in bad.values())
    assert culprits(analysis) == {1}
    assert sorted(chdb.query("SELECT rank FROM ranks WHERE run_id = 'r'")["rank"]) == [0, 1]


def test_content_not_name_decides(tmp_path) -> None:
    src = realdata("handed", "watchdog_desync_4r", "rank2.log")
    odd = tmp_path / "rank2.pkl"
    shutil.copy(src, odd)
    assert sniff(str(odd))[0] == "log"
    gz = tmp_path / "whatever.bin"
    gz.write_bytes(
        gzip.compress(open(realdata("nvrx_fr_dumps", "gpu_error_1st", "_dump_0"), "rb").read())
    )
    assert sniff(str(gz))[0] == "flight_recorder"


def test_replay_three_stage_pipeline() -> None:
    """Two microbatches through stages 0 -> 1 (eager send, recv waits), then a DP-style
    collective of both ranks: replay by hand."""
    rows = []

    def op(rank, t, kind, dur, key="", phase="", mb=-1):
        rows.append({"rank": rank, "step": 0, "t": t, "kind": kind, "dur_ns": dur, "key": key,
                     "phase": phase, "microbatch": mb})  # fmt: skip

    for mb in (0, 1):
        op(0, 10 * mb, "compute", 5.0, phase="forward", mb=mb)
        op(0, 10 * mb + 5, "send", 1.0, key=f"p{mb}")
        op(1, 10 * mb, "recv", 1.0, key=f"p{mb}")
        op(1, 10 * mb + 1, "compute", 2.0, phase="forward", mb=mb)
    op(0, 100, "coll", 3.0, key="ar")
    op(1, 100, "coll", 3.0, key="ar")
    ops = pd.DataFrame(rows)
    # rank 0: sends at 5 and 10; rank 1: recv 6, compute 8, recv 11, compute 13; ar 13+3
    assert replay(ops).loc[0] == 16.0
    w = whatif_slowdown(ops, [0], pd.Series({0: 0, 1: 0}))  # rank 0 at rank 1's 2.0
    # rank 0: sends at 2 and 4, arrives at 4; rank 1: recv 3, compute 5, recv 6, compute 8
    assert w.step_ns_without.loc[0] == 8.0 + 3.0
    assert w.slowdown == pytest.approx(16.0 / 11.0)


def test_cli_import_reports_culprit(tmp_path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "ranksight.cli", "import", realdata("handed", "watchdog_desync_4r"),
         "--store", str(tmp_path / "s"), "--run", "wd", "--format", "json"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 3, out.stderr
    report = json.loads(out.stdout)
    assert [f["culprit_rank"] for f in report["findings"]] == [2]
    assert "rank2.log: log rank 2: 1 watchdog timeout" in out.stderr
    missing = subprocess.run(
        [sys.executable, "-m", "ranksight.cli", "import", str(tmp_path / "nope"), "--store", str(tmp_path / "s")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert missing.returncode == 1 and "nope" in missing.stderr  # as a missing --store


def test_flight_recorder_rows_are_written_within_the_memory_budget(chdb, tmp_path, monkeypatch):
    """Without profiler traces to merge into them, dump rows go out as the import reads
    them (a big job's hang leaves thousands of dumps), not all held to the end."""
    from ranksight.importer import run as run_mod

    folder = tmp_path / "in"
    folder.mkdir()
    dump = os.path.join(FR_NCCL, "nccl_trace_rank_0.gz")  # NCCL: members in pg_config
    for rank in range(8):  # 1,491 entries a dump: past the 10,000-row floor of the budget
        shutil.copy(dump, folder / f"nccl_trace_rank_{rank}.gz")
    writes = []
    real_write = run_mod._Writer.write

    def write(self, rows):
        writes.append(len(rows.tables.get("collectives", [])))
        return real_write(self, rows)

    monkeypatch.setattr(run_mod._Writer, "write", write)
    result = import_paths(chdb, [str(folder)], ImportConfig(run_id="big", memory_mb=16))
    assert len(result.imported) == 8 and result.rows["collectives"] == sum(writes)
    assert sum(1 for n in writes if n) >= 2, writes  # some written before the end


def test_truncated_tar_gz_is_named_and_the_rest_imported(chdb, tmp_path) -> None:
    import tarfile

    folder = tmp_path / "in"
    folder.mkdir()
    whole = tmp_path / "slow.tar.gz"
    with tarfile.open(whole, "w:gz") as t:
        t.add(os.path.join(DATA, "nccl_slow"), arcname="nccl_slow")
    (folder / "cut.tar.gz").write_bytes(whole.read_bytes()[:2000])  # ends inside a member
    shutil.copy(os.path.join(DATA, "nccl_hang", "fr_rank0.json.gz"), folder)
    result = import_paths(chdb, [str(folder)], ImportConfig(run_id="cut"))
    bad = {os.path.basename(f.path): f.message for f in result.failed}
    assert "cannot unpack the archive" in bad["cut.tar.gz"], bad
    assert [(f.kind, f.rank) for f in result.imported] == [("flight_recorder", 0)]
