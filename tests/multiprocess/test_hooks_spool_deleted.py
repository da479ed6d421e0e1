"""The spool's run folder deleted under a running rank (``rm -rf <spool>/<run_id>``): the
writer notices, counts what went to the deleted file as lost, and writes on into a new
segment the agent reads (trainer_hooks/spool.py)."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import time

from ranksight.trainer_hooks.spool import SpoolWriter, spool_path
from tests.helpers.spool import read_spool

HEADER = {"run_id": "run-d", "attempt": 0, "rank": 3}


def _steps(first: int, n: int) -> list[dict]:
    return [
        {"t": "steps", "step": s, "start_ns": s, "end_ns": s + 1} for s in range(first, first + n)
    ]


def _until(condition, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "the writer thread did not get there"
        time.sleep(0.01)


def test_records_after_the_folder_is_deleted_land_in_a_new_readable_segment(tmp_path):
    root = tmp_path / "spool"
    check_s = 3.0
    t0 = time.monotonic()
    w = SpoolWriter(spool_path(str(root), "run-d", 0, 3), HEADER, max_buffered=10**6,
                    budget_bytes=1 << 30, flush_interval_s=0.02,
                    check_interval_s=check_s)  # fmt: skip
    first = w.path
    for r in _steps(0, 100):
        w.put(r)
    _until(lambda: w.records == 100)
    shutil.rmtree(root / "run-d")  # before the writer's first check
    for r in _steps(100, 50):
        w.put(r)
    _until(lambda: w.records == 150)  # written, to a file no one can read any more
    assert time.monotonic() - t0 < check_s, "too slow to test before the first check"
    _until(lambda: w.lost > 0)  # the check: noticed, the segment reopened
    assert (w.lost, w.dropped, w.records) == (150, 150, 0)
    assert "deleted" in w.error and first in w.error
    for r in _steps(150, 70):
        w.put(r)
    w.close()
    assert (w.records, w.dropped, w.lost) == (70, 150, 150)  # records + dropped = all put
    assert w.path != first and os.path.exists(w.path)
    for folder in (root / "run-d", root / "run-d" / "a0"):
        assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700  # recreated private
    steps = read_spool(str(root))["steps"]  # the agent's reader: header, frames, end
    assert sorted(steps["step"]) == list(range(150, 220))
    assert set(steps["rank"]) == {3} and set(steps["run_id"]) == {"run-d"}


SCRIPT = r"""
import json, os, socket, sys, time
import torch, torch.distributed as dist
from ranksight import trainer_hooks

s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
dist.init_process_group("gloo", rank=0, world_size=1)
hooks = trainer_hooks.attach(spool_dir=sys.argv[1], run_id="gone", flush_interval_s=0.05)
step = 0
def one():
    global step
    with hooks.step(step):
        dist.all_reduce(torch.ones(4))
    step += 1
    time.sleep(0.01)
while not os.path.exists(sys.argv[2]):  # the test deletes the run folder, then makes this
    one()
t = time.monotonic()
while time.monotonic() - t < 2.5 and not hooks.stats["lost"]:  # the writer's check
    one()
after = step
for _ in range(20):
    one()
print(json.dumps({"stats": hooks.close(), "after": after, "last": step - 1}))
"""


def test_a_hooked_rank_goes_on_recording_after_its_run_folder_is_deleted(tmp_path):
    spool = tmp_path / "spool"
    go = tmp_path / "deleted"
    proc = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, str(spool), str(go)], text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    try:
        _until(lambda: len(list((spool / "gone" / "a0").glob("*.spool"))) > 0, 60)
        time.sleep(1.0)
        shutil.rmtree(spool / "gone")
        go.write_text("")
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err[-3000:]
    got = json.loads(out.strip().splitlines()[-1])
    stats = got["stats"]
    assert stats["lost"] > 0 and stats["dropped"] == stats["lost"], stats
    frames = read_spool(str(spool))
    steps = sorted(frames["steps"]["step"])
    assert steps[-20:] == list(range(got["last"] - 19, got["last"] + 1))  # after the reopen
    assert steps == list(range(steps[0], got["last"] + 1))  # nothing missing after it
    (end,) = frames["rank_ends"][["reason"]].to_dict("records")
    assert end == {"reason": "finished"}
    last = frames["hook_stats"].sort_values("ts_ns").iloc[-1]
    assert int(last["dropped"]) == stats["lost"]  # the stats the agent ships say so


def test_a_segment_that_could_not_be_opened_is_tried_again(tmp_path):
    root = tmp_path / "spool"
    root.write_text("a file where the spool folder goes")
    w = SpoolWriter(spool_path(str(root), "run-d", 0, 3), HEADER, max_buffered=10**6,
                    budget_bytes=1 << 30, flush_interval_s=0.02,
                    check_interval_s=0.2)  # fmt: skip
    assert w.error and "cannot open spool file" in w.error
    for r in _steps(0, 10):
        w.put(r)
    _until(lambda: w.dropped == 10)  # nowhere to write them
    root.unlink()  # the obstacle goes
    time.sleep(0.3)  # a check: the segment is opened
    for r in _steps(10, 5):
        w.put(r)
    w.close()
    assert (w.records, w.dropped) == (5, 10)
    assert sorted(read_spool(str(root))["steps"]["step"]) == list(range(10, 15))
