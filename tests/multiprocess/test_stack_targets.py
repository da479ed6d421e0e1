"""py-spy dumps only processes that are a run's ranks by the spool's own evidence: a forged
``ranks`` row or a planted spool file naming an unrelated process (one of this user, one
of another user) is refused and named, never dumped or stored; the real rank is dumped.
Real processes, real py-spy (this container allows ptrace of its own processes: the
real rank's dump must succeed, so a refusal path alone cannot pass this test)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import psutil
import pytest

from ranksight.agent.stacks import take_stacks
from ranksight.collectors.base import frame
from ranksight.collectors.local_ranks import LocalRank, rank_problem
from ranksight.collectors.pyspy import StackTaker
from ranksight.store import open_store
from tests.helpers.rank_process import spawn

NOBODY = 65534
PYTHON = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys.executable
SLEEPER = [PYTHON, "-c", "import time; time.sleep(120)"]
"""An unrelated Python process (py-spy could dump it), runnable by uid 65534 too."""


def _as_nobody() -> None:
    os.setgid(NOBODY)
    os.setuid(NOBODY)


@pytest.fixture
def scene(tmp_path):
    """A real stuck rank 0 of ``run-t``; an unrelated sleeping Python of this user and (as
    root) one of uid 65534; forged ``ranks`` rows naming them (ranks 5, 6) and spool files the
    agent's user planted naming them (ranks 7, 8)."""
    spool = str(tmp_path / "spool")
    rank, _ = spawn(spool, "run-t", 0, "stuck")
    others = [subprocess.Popen(SLEEPER, cwd="/")]
    if os.geteuid() == 0:
        others.append(subprocess.Popen(SLEEPER, cwd="/", preexec_fn=_as_nobody))
    store = open_store(f"chdb://{tmp_path / 'store'}")
    store.init_schema()
    host = socket.gethostname()
    rows = [{"run_id": "run-t", "attempt": 0, "rank": 0, "host": host, "pid": rank.pid}]
    for i, p in enumerate(others):
        rows.append({"run_id": "run-t", "attempt": 0, "rank": 5 + i, "host": host, "pid": p.pid})
        open(os.path.join(spool, "run-t", "a0", f"rank{7 + i:05d}-{p.pid}.jsonl"), "w").close()
    store.insert("ranks", frame("ranks", rows))
    yield spool, store, rank, others
    for p in [rank, *others]:
        p.kill()
        p.wait()


def test_forged_rows_and_planted_files_are_refused_and_the_real_rank_dumped(scene) -> None:
    spool, store, rank, others = scene
    rows = take_stacks(store, "run-t", spool_dir=spool)
    by_rank = {r["rank"]: r for r in rows}
    assert by_rank[0]["ok"] == 1 and by_rank[0]["pid"] == rank.pid
    assert "wait_for_peer (tests/helpers/rank_process.py:" in by_rank[0]["summary"]
    forged = [(5 + i, p.pid) for i, p in enumerate(others)]
    planted = [(7 + i, p.pid) for i, p in enumerate(others)]
    assert sorted(by_rank) == sorted([0] + [k for k, _ in forged + planted])
    for k, pid in forged + planted:
        r = by_rank[k]
        assert (r["ok"], r["pid"], r["threads"], r["stack_json"]) == (0, pid, 0, "")
        assert r["error"].startswith("refused: ") and f"pid {pid}" in r["error"], r["error"]
    for k, _ in forged:
        assert "ranks table only" in by_rank[k]["error"]
    assert "holds none of rank 7's spool files open" in by_rank[7]["error"]
    stored = store.query("SELECT rank, pid, ok FROM stacks").to_dict("records")
    assert stored == [{"rank": 0, "pid": rank.pid, "ok": 1}], "refusals are never stored"


def test_a_process_of_another_user_is_refused(scene) -> None:
    spool, store, _, others = scene
    if len(others) < 2:
        pytest.skip("needs root to start a process of uid 65534")
    assert psutil.Process(others[1].pid).uids().real == NOBODY
    by_rank = {r["rank"]: r for r in take_stacks(store, "run-t", spool_dir=spool)}
    assert "ranks table only" in by_rank[6]["error"]
    assert f"pid {others[1].pid} runs as uid {NOBODY}" in by_rank[8]["error"], by_rank[8]
    assert by_rank[8]["ok"] == 0 and by_rank[8]["stack_json"] == ""
    got = store.query("SELECT count() AS n FROM stacks WHERE pid = %(p)s", {"p": others[1].pid})
    assert got["n"].tolist() == [0]


def test_the_stacks_command_names_what_it_refused(scene) -> None:
    spool, store, rank, others = scene
    out = subprocess.run(
        [sys.executable, "-m", "ranksight.cli", "stacks", "--run", "run-t", "--spool", spool,
         "--store", store.url],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert "ranks 0 (1):" in out.stdout and "wait_for_peer" in out.stdout
    for i, p in enumerate(others):
        assert f"rank {5 + i} (pid {p.pid}): no stack: refused: " in out.stdout, out.stdout


def test_with_no_spool_the_ranks_table_alone_dumps_nothing(scene, tmp_path) -> None:
    spool, store, rank, _ = scene
    rows = take_stacks(store, "run-t", spool_dir=str(tmp_path / "no-spool"))
    assert rows and all(r["ok"] == 0 and r["error"].startswith("refused: ") for r in rows)
    assert rank.pid in {r["pid"] for r in rows}, "even a real rank's pid, by the table alone"
    assert store.query("SELECT count() AS n FROM stacks")["n"].tolist() == [0]


def test_the_gate_sits_in_front_of_every_dump(scene) -> None:
    """The stall watcher's path: StackTaker itself refuses a rank the spool does not prove."""
    spool, _, rank, others = scene
    path = os.path.join(spool, "run-t", "a0", f"rank00007-{others[0].pid}.jsonl")
    planted = LocalRank("run-t", 0, 7, others[0].pid, path)
    real = LocalRank("run-t", 0, 0, rank.pid, os.path.join(
        spool, "run-t", "a0", f"rank00000-{rank.pid}.jsonl"))  # fmt: skip
    assert rank_problem(real) is None
    mismatched = LocalRank("run-t", 0, 1, rank.pid, real.spool_path)
    assert "does not name rank 1" in rank_problem(mismatched)
    taker = StackTaker("n1")
    rows = taker.take([real, planted], "no_progress")
    assert [(r["rank"], r["ok"]) for r in rows] == [(0, 1)]
    assert [(r["rank"], r["ok"]) for r in taker.refused] == [(7, 0)]


WRITER = """
import sys, time
from ranksight.trainer_hooks.spool import SpoolWriter, spool_path
header = {"run_id": "run-h", "attempt": 0, "rank": 3}
w = SpoolWriter(spool_path(sys.argv[1], "run-h", 0, 3), header, max_buffered=100,
                budget_bytes=1 << 20, flush_interval_s=0.05)
w.put({"t": "steps", "step": 1})
print(w.path, flush=True)
time.sleep(120)
"""


def test_a_rank_writing_spool_segments_is_dumped(tmp_path) -> None:
    """The hooks' own writer (binary segments, ``trainer_hooks/spool.py``) proves its rank."""
    spool = str(tmp_path / "spool")
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, spool], stdout=subprocess.PIPE, text=True
    )
    try:
        path = proc.stdout.readline().strip()
        assert path.endswith("-0000.spool") and os.path.exists(path)
        store = open_store(f"chdb://{tmp_path / 'store'}")
        store.init_schema()
        rows = take_stacks(store, "run-h", spool_dir=spool)
        assert [(r["rank"], r["pid"], r["ok"]) for r in rows] == [(3, proc.pid, 1)], rows
    finally:
        proc.kill()
        proc.wait()
