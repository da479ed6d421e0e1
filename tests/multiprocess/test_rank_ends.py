"""How a rank's process ends, as its own hooks record it (trainer_hooks/exits.py)."""

from __future__ import annotations

import glob
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from ranksight.collectors.base import NodeContext
from ranksight.collectors.postmortem import PostmortemCollector, inflight_rows
from tests.helpers.spool import read_spool

WORKER = os.path.join(os.path.dirname(os.path.dirname(__file__)), "workers", "rank_end.py")
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(tmp_path, rank: int, world: int, mode: str, port: int) -> subprocess.Popen:
    args = [sys.executable, WORKER, str(tmp_path), "ends", str(port), str(rank), str(world), mode]
    return subprocess.Popen(
        args, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _run_alone(tmp_path, mode: str) -> subprocess.CompletedProcess:
    args = [sys.executable, WORKER, str(tmp_path), "ends", str(_port()), "0", "1", mode]
    return subprocess.run(args, env=ENV, capture_output=True, text=True, timeout=120)


def _blocked_then(tmp_path, sig: int) -> tuple[int, float]:
    """Rank 0 of 2 enters an all_reduce rank 1 never joins; once its progress shows it
    inside, send it ``sig``. Returns (its exit status, seconds it took to die)."""
    port = _port()
    procs = [_start(tmp_path, r, 2, "blocked", port) for r in (0, 1)]
    try:
        assert procs[0].stdout.readline().strip() == "entering"
        deadline = time.monotonic() + 60
        blocked = False
        while time.monotonic() < deadline and not blocked:
            time.sleep(0.5)
            prog = read_spool(str(tmp_path)).get("progress")
            if prog is not None and not prog.empty:
                r0 = prog[(prog["rank"] == 0) & (prog["direction"] == "")]
                blocked = bool((r0["issued_seq"] > r0["completed_seq"]).any())
        # the progress snapshot shows the rank as having entered the op it is stuck in
        assert blocked, "rank 0's progress never showed the blocking all_reduce as entered"
        t0 = time.monotonic()
        procs[0].send_signal(sig)
        rc = procs[0].wait(30)
        return rc, time.monotonic() - t0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()


def test_sigterm_while_blocked_in_a_collective_is_recorded_and_still_kills(tmp_path):
    rc, took = _blocked_then(tmp_path, signal.SIGTERM)
    assert rc == -signal.SIGTERM  # dies of the signal, as without the hooks
    assert took < 10
    frames = read_spool(str(tmp_path))
    ends = frames["rank_ends"]
    assert ends[["rank", "reason", "code", "detail", "last_step"]].to_dict("records") == [
        {"rank": 0, "reason": "signal", "code": 15, "detail": "SIGTERM", "last_step": 1}
    ]
    c = frames["collectives"]
    stuck = c[(c["rank"] == 0) & (c["end_ns"] == 0)]
    assert list(stuck["op"]) == ["all_reduce"] and list(stuck["numel_in"]) == [4096]
    assert list(stuck["step"]) == [1]
    # the hooks wrote the in-flight op themselves: the black box has nothing to add
    (box,) = glob.glob(str(tmp_path / "ends" / "a0" / "blackbox-rank00000-*.bin"))
    assert inflight_rows(box, "ends", 0, 0) == []


def test_a_rank_killed_inside_a_collective_leaves_it_in_its_black_box(tmp_path):
    rc, _ = _blocked_then(tmp_path, signal.SIGKILL)
    assert rc == -signal.SIGKILL
    frames = read_spool(str(tmp_path))
    assert "rank_ends" not in frames or frames["rank_ends"].empty
    assert "collectives" not in frames  # the spool never saw the op it died in
    collector = PostmortemCollector(NodeContext(host="h", spool_dir=str(tmp_path)))
    rows = collector.collect(time.time_ns())
    dead = [r for r in rows["collectives"] if r["rank"] == 0]
    assert [(r["op"], r["numel_in"], r["step"], r["phase"], r["end_ns"]) for r in dead] == [
        ("all_reduce", 4096, 1, "forward", 0)
    ]
    assert dead[0]["group_seq"] == 0 and dead[0]["group_ranks"] == "0,1"
    (gone,) = [r for r in rows["rank_ends"] if r["rank"] == 0]
    assert (gone["source"], gone["reason"], gone["last_step"]) == ("agent", "gone", 1)
    assert gone["ts_ns"] >= dead[0]["enqueue_ns"]  # its last op
    # shipped once
    assert collector.collect(time.time_ns())["collectives"] == []


@pytest.mark.parametrize(
    ("mode", "rc", "reason", "detail"),
    [
        ("raise", 1, "exception", "RuntimeError: boom in step 1"),
        ("clean", 0, "finished", ""),
    ],
)
def test_exception_and_clean_close_are_recorded(tmp_path, mode, rc, reason, detail):
    out = _run_alone(tmp_path, mode)
    assert out.returncode == rc, out.stderr[-3000:]
    ends = read_spool(str(tmp_path))["rank_ends"]
    assert ends[["reason", "detail"]].to_dict("records") == [{"reason": reason, "detail": detail}]
    runs = read_spool(str(tmp_path))["runs"]
    assert runs["status"].iloc[-1] == ("finished" if mode == "clean" else "failed")
    if mode == "raise":
        assert "boom in step 1" in out.stderr  # the script's own traceback still printed
    assert glob.glob(str(tmp_path / "ends" / "a0" / "crash-*.txt")) == []


def test_a_process_killed_outright_records_nothing_after_its_last_step(tmp_path):
    out = _run_alone(tmp_path, "exit")
    assert out.returncode == 17
    frames = read_spool(str(tmp_path))
    assert "rank_ends" not in frames or frames["rank_ends"].empty
    assert list(frames["steps"]["step"]) == [0]


def test_a_fatal_signal_leaves_the_python_stacks(tmp_path):
    out = _run_alone(tmp_path, "abort")
    assert out.returncode == -signal.SIGABRT
    (crash,) = glob.glob(str(tmp_path / "ends" / "a0" / "crash-rank00000-*.txt"))
    text = open(crash).read()
    assert "Fatal Python error: Aborted" in text
    assert "rank_end.py" in text and "line" in text
    rows = PostmortemCollector(NodeContext(host="h", spool_dir=str(tmp_path))).collect(0)
    (stack,) = rows["stacks"]
    assert stack["trigger"] == "crash" and stack["rank"] == 0 and stack["summary"] == text


def test_the_second_of_two_racing_ends_waits_for_the_first_to_finish_writing():
    import threading

    from ranksight.trainer_hooks.exits import ExitRecorder

    written, entered = [], threading.Event()

    def slow_end(reason, code, detail):
        entered.set()
        time.sleep(0.3)  # writing the spool
        written.append(reason)

    rec = ExitRecorder(slow_end)
    t = threading.Thread(target=rec.end, args=("signal", 15, "SIGTERM"))
    t.start()
    entered.wait(5)
    t0 = time.monotonic()
    assert rec.end("signal", 15, "SIGTERM") is False  # the other path got there first
    assert written == ["signal"] and time.monotonic() - t0 > 0.2  # ...and it waited
    t.join()
