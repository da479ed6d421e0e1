"""Local rank discovery, host and process samples, py-spy stacks and the stall watcher, on
real local processes (tests/helpers/rank_process.py)."""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import socket
import subprocess
import sys
import time

import psutil
import pytest

from ranksight.agent.stacks import format_stacks, group_stacks, take_stacks
from ranksight.agent.stall import StallWatcher, appended_progress
from ranksight.collectors.base import NodeContext
from ranksight.collectors.host import HostCollector
from ranksight.collectors.local_ranks import LocalRanks, scan_spool
from ranksight.collectors.pyspy import PERMISSION_FIX, PySpyConfig, StackTaker, find_pyspy
from tests.helpers.rank_process import spawn


@pytest.fixture
def ranks(tmp_path):
    """Two rank processes of run ``run-t``: rank 0 trains, rank 1 is stuck."""
    spool = str(tmp_path / "spool")
    procs = [spawn(spool, "run-t", 0, "train"), spawn(spool, "run-t", 1, "stuck")]
    yield spool, procs
    for proc, _ in procs:
        proc.kill()
        proc.wait()


def test_local_ranks_are_live_processes_with_a_spool_file(ranks, tmp_path) -> None:
    spool, procs = ranks
    found = scan_spool(spool)
    assert [(r.run_id, r.attempt, r.rank, r.pid) for r in found] == [
        ("run-t", 0, 0, procs[0][0].pid),
        ("run-t", 0, 1, procs[1][0].pid),
    ]
    old = os.path.join(spool, "run-old", "a0", f"rank00007-{os.getpid()}.jsonl")
    os.makedirs(os.path.dirname(old))
    open(old, "w").close()
    os.utime(old, (time.time() - 3600, time.time() - 3600))  # written before this pid started
    dead = os.path.join(spool, "run-old", "a0", "rank00008-999999999.jsonl")
    open(dead, "w").close()
    assert len(scan_spool(spool)) == 2, "a reused pid and a gone pid are no ranks"
    assert {r.rank for r in scan_spool(spool, alive_only=False)} == {0, 1, 7, 8}
    procs[0][0].kill()
    procs[0][0].wait()
    assert [r.rank for r in LocalRanks(spool, refresh_s=0).get()] == [1]


def test_host_and_rank_process_samples(ranks, tmp_path) -> None:
    spool, procs = ranks
    host = HostCollector(
        NodeContext(host="n1", spool_dir=spool, data_dir=str(tmp_path)),
        local_ranks=LocalRanks(spool, refresh_s=0),
    )
    host.open()
    first = host.collect(1)
    time.sleep(0.5)
    second = host.collect(2)
    h1, h2 = first["host_samples"][0], second["host_samples"][0]
    assert math.isnan(h1["cpu_pct"]) and 0 <= h2["cpu_pct"] <= 100
    assert len(h2["cpu_core_pct"].split(",")) == h2["cpu_cores"] == psutil.cpu_count()
    assert 0 < h2["mem_available_bytes"] <= h2["mem_total_bytes"] and h2["disk_free_bytes"] > 0
    assert h2["disk_path"] == str(tmp_path)
    rows = {r["rank"]: r for r in second["proc_samples"]}
    assert set(rows) == {0, 1} and rows[0]["pid"] == procs[0][0].pid
    assert all(math.isnan(r["cpu_pct"]) for r in first["proc_samples"]), "no CPU window yet"
    for r in rows.values():
        assert r["rss_bytes"] > 1 << 20 and r["threads"] >= 1 and r["ctx_voluntary"] > 0
        assert 0 <= r["cpu_pct"] < 100 * psutil.cpu_count()
        assert r["io_write_bytes"] >= 0, "own user's processes: I/O is readable"
        assert r["run_delay_ns"] >= 0  # schedstat of every thread, summed
    firsts = {r["rank"]: r for r in first["proc_samples"]}
    assert all(rows[k]["run_delay_ns"] >= firsts[k]["run_delay_ns"] for k in rows)  # cumulative


def test_pyspy_dumps_registered_ranks_in_parallel(ranks, tmp_path) -> None:
    spool, procs = ranks
    from ranksight.store import open_store

    store = open_store(f"chdb://{tmp_path / 'store'}")
    store.init_schema()
    unregistered = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        rows = take_stacks(store, "run-t", spool_dir=spool)
    finally:
        unregistered.kill()
        unregistered.wait()
    assert [(r["rank"], r["pid"], r["ok"], r["trigger"]) for r in rows] == [
        (0, procs[0][0].pid, 1, "manual"),
        (1, procs[1][0].pid, 1, "manual"),
    ]
    stuck = rows[1]
    assert "wait_for_peer (tests/helpers/rank_process.py:" in stuck["summary"]
    threads = json.loads(stuck["stack_json"])
    assert threads[0]["frames"] and stuck["threads"] == len(threads)
    assert abs(rows[0]["ts_ns"] - rows[1]["ts_ns"]) == 0, "one trigger time for the node's dumps"
    stored = store.query("SELECT rank, trigger, ok FROM stacks ORDER BY rank").to_dict("records")
    assert stored == [
        {"rank": 0, "trigger": "manual", "ok": 1},
        {"rank": 1, "trigger": "manual", "ok": 1},
    ]
    groups = group_stacks(rows)
    assert [ranks for _, ranks in groups] in ([[0], [1]], [[1], [0]])
    assert "wait_for_peer" in format_stacks(rows)


def test_stacks_command_and_ranks_found_through_the_store(ranks, tmp_path) -> None:
    spool, procs = ranks
    from ranksight.collectors.base import frame
    from ranksight.store import open_store

    url = f"chdb://{tmp_path / 'store'}"
    out = subprocess.run(
        [sys.executable, "-m", "ranksight.cli", "stacks", "--run", "run-t", "--spool", spool, "--store", url],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert (
        "wait_for_peer (tests/helpers/rank_process.py:" in out.stdout
        and "ranks 0 (1):" in out.stdout
    )
    store = open_store(url)
    row = {
        "run_id": "run-t",
        "attempt": 0,
        "rank": 1,
        "host": socket.gethostname(),
        "pid": procs[1][0].pid,
    }
    store.insert("ranks", frame("ranks", [row]))
    rows = take_stacks(store, "run-t", spool_dir=str(tmp_path / "no-spool"))
    assert [(r["rank"], r["ok"]) for r in rows] == [(1, 0)], "the table alone proves no pid"
    assert rows[0]["error"].startswith("refused: ")  # tests/multiprocess/test_stack_targets.py
    none = subprocess.run(
        [sys.executable, "-m", "ranksight.cli", "stacks", "--run", "run-nope", "--spool", spool, "--store", url],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert none.returncode == 1 and "has no live rank" in none.stderr


@pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("setpriv"),
    reason="needs root and setpriv to drop to nobody",
)
def test_pyspy_without_permission_says_so_once_with_the_fix(ranks, tmp_path, caplog) -> None:
    spool, _ = ranks
    binary = str(tmp_path / "py-spy")
    shutil.copy(find_pyspy(), binary)
    os.chmod(tmp_path, 0o755)
    nobody = ("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", binary)
    taker = StackTaker("n1", PySpyConfig(command=nobody, timeout_s=10))
    with caplog.at_level(logging.WARNING, logger="ranksight.collectors.pyspy"):
        rows = taker.take(scan_spool(spool), "manual") + taker.take(scan_spool(spool), "manual")
    assert [r["ok"] for r in rows] == [0, 0, 0, 0]
    assert all("Permission Denied" in r["error"] and "SYS_PTRACE" in r["error"] for r in rows)
    assert [rec.message for rec in caplog.records] == [PERMISSION_FIX]


def test_stall_watcher_dumps_a_run_once_per_stall(ranks) -> None:
    spool, procs = ranks
    watcher = StallWatcher(
        NodeContext(host="n1", spool_dir=spool),
        stall_s=1.0,
        interval_s=0.2,
        local_ranks=LocalRanks(spool, refresh_s=0),
    )
    watcher.open()
    assert watcher.collect(1) == {"stacks": []}
    time.sleep(1.3)
    rows = watcher.collect(2)["stacks"]
    assert [(r["rank"], r["trigger"], r["ok"]) for r in rows] == [
        (0, "no_progress", 1),
        (1, "no_progress", 1),
    ]
    assert "wait_for_peer" in rows[1]["summary"] and "wait_for_peer" not in rows[0]["summary"]
    assert os.path.exists(os.path.join(spool, "run-t", "a0", "fr-dump-request")), (
        "and a Flight Recorder dump"
    )
    time.sleep(0.3)
    assert watcher.collect(3) == {"stacks": []}, "once per stall"
    open(procs[1][1] + ".move", "w").close()  # the stuck rank moves on
    time.sleep(0.6)
    assert watcher.collect(4) == {"stacks": []}
    assert watcher._dumped == set(), "progress re-arms the watcher"


def test_appended_progress_reads_only_new_complete_lines(tmp_path) -> None:
    path = str(tmp_path / "rank00000-1.jsonl")
    with open(path, "wb") as f:
        f.write(b'{"t":"_header"}\n{"t":"steps","step":0}\n')
    offset, moved = appended_progress(path, None)
    assert (offset, moved) == (os.path.getsize(path), False)
    with open(path, "ab") as f:
        f.write(b'{"t":"progress","ts_ns":1}\n{"t":"progress","ts_ns":2}\n{"t":"ste')
    offset2, moved = appended_progress(path, offset)
    assert not moved and offset2 == offset + len(
        b'{"t":"progress","ts_ns":1}\n{"t":"progress","ts_ns":2}\n'
    )
    with open(path, "ab") as f:
        f.write(b'ps","step":1}\n')
    assert appended_progress(path, offset2)[1], "a finished steps record is progress"
    with open(path, "ab") as f:
        f.write(b'{"t":"progress"}\n' * 5000)
    assert appended_progress(path, os.path.getsize(path) - 80_000)[1], (
        "a large append counts as progress unread"
    )
