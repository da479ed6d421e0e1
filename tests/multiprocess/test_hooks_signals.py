"""A script's own signal handling is kept with the hooks attached (trainer_hooks/exits.py):
each script runs with and without the hooks and must end the same way, and the hooks
record the signal (``rank_ends``) wherever the process lets them see it."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from tests.helpers.spool import read_spool

WORKER = os.path.join(os.path.dirname(os.path.dirname(__file__)), "workers", "signal_job.py")
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(tmp_path, mode: str, sig: str, hooks: bool, port: int, rank=0, world=1):
    args = [sys.executable, WORKER, str(tmp_path / "spool"), "sig", str(port), mode, sig,
            str(tmp_path / f"ckpt{rank}"), "1" if hooks else "0", str(rank), str(world)]  # fmt: skip
    return subprocess.Popen(
        args, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _signalled(tmp_path, mode: str, sig: str, hooks: bool) -> tuple[int, bool, dict | None, str]:
    """Run the script, send ``sig`` once it is ready; (exit status, checkpoint written,
    its last JSON line or None, stderr)."""
    proc = _spawn(tmp_path, mode, sig, hooks, _port())
    try:
        assert proc.stdout.readline().strip() == "ready", proc.stderr.read()[-3000:]
        time.sleep(0.3)  # a few steps in
        proc.send_signal(signal.Signals[f"SIG{sig}"])
        if mode == "ignore":
            time.sleep(1.0)  # ignored: it goes on stepping
            assert proc.poll() is None, "SIG_IGN: the signal must not end the process"
            (tmp_path / "ckpt0").write_text("go on and finish\n")
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    lines = [ln for ln in out.splitlines() if ln.startswith("{")]
    return (
        proc.returncode,
        (tmp_path / "ckpt0").exists(),
        json.loads(lines[-1]) if lines else None,
        err,
    )


def _ends(tmp_path) -> list[tuple[str, int]]:
    frames = read_spool(str(tmp_path / "spool"))
    ends = frames.get("rank_ends")
    if ends is None or ends.empty:
        return []
    return [(r.reason, int(r.code)) for r in ends.sort_values("ts_ns").itertuples()]


CASES = [
    # mode, signal, exit status, checkpoint written, rank_ends rows with the hooks
    ("default", "TERM", -15, False, [("signal", 15)]),
    ("before", "TERM", 0, True, [("signal", 15), ("finished", 0)]),
    ("after", "TERM", 0, True, [("signal", 15), ("finished", 0)]),
    ("exit", "TERM", 0, True, [("signal", 15), ("exit", -1)]),
    ("chain", "TERM", -15, True, [("signal", 15)]),
    ("ignore", "TERM", 0, True, [("finished", 0)]),  # CKPT: the test's "finish now"
    ("default", "INT", -2, False, [("signal", 2)]),
    ("after", "INT", 0, True, [("signal", 2), ("finished", 0)]),
    ("asyncio", "TERM", 0, True, [("finished", 0)]),
]


@pytest.mark.parametrize(("mode", "sig", "rc", "ckpt", "ends"), CASES)
def test_the_script_ends_as_it_would_without_the_hooks(tmp_path, mode, sig, rc, ckpt, ends):
    bare = tmp_path / "bare"
    bare.mkdir()
    got_bare = _signalled(bare, mode, sig, hooks=False)
    assert got_bare[:2] == (rc, ckpt), got_bare[3][-3000:]  # the script's own behaviour
    got = _signalled(tmp_path, mode, sig, hooks=True)
    assert got[:2] == (rc, ckpt), got[3][-3000:]  # ...kept with the hooks attached
    assert _ends(tmp_path) == ends
    if got[2] is not None and mode == "asyncio":
        assert got[2]["wakeup_is_loops"] is True, "closing the hooks took the loop's wakeup fd"
    if rc == 0 and mode != "asyncio":
        if mode != "exit":  # sys.exit in the handler: no stats printed
            assert got[2]["stats"]["records"] > 0 and got[2]["stats"]["dropped"] == 0
        steps = read_spool(str(tmp_path / "spool"))["steps"]
        assert len(steps) > 3  # it went on recording through and after the signal


def test_a_handler_of_the_script_is_not_overridden_while_blocked_in_a_collective(tmp_path):
    """The script's handler can only run once the collective returns (here: never), so
    without the hooks the process lives on; the hooks must not kill it, but record that
    the signal came."""
    port = _port()
    procs = [_spawn(tmp_path, "blocked", "TERM", True, port, r, 2) for r in (0, 1)]
    try:
        assert procs[0].stdout.readline().strip() == "ready"
        time.sleep(1.5)  # inside the all_reduce
        procs[0].send_signal(signal.SIGTERM)
        time.sleep(2.0)
        assert procs[0].poll() is None, "the hooks killed a rank whose script handles SIGTERM"
        assert _ends(tmp_path) == [("signal", 15)]  # noted; the spool stays open
        assert not (tmp_path / "ckpt0").exists()  # the handler has not run yet, as without hooks
    finally:
        for p in procs:
            p.kill()
            p.wait()
