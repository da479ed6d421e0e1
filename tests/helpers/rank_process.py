"""A stand-in rank process for collector tests: registers itself with a spool file the way
the hooks do (``<spool>/<run_id>/a<attempt>/rank<r>-<pid>.jsonl``), then either keeps
making progress (a ``steps`` record every 0.2 s, in ``train_loop``) or is stuck (only the
writer's ``progress`` snapshots, in ``wait_for_peer``) until it is told to move by a file.

    python tests/helpers/rank_process.py SPOOL RUN_ID RANK MODE     # MODE: train | stuck
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time


def spawn(
    spool: str, run_id: str, rank: int, mode: str, timeout_s: float = 20.0
) -> tuple[subprocess.Popen, str]:
    """Start one and wait until its spool file holds its first record; returns the
    process and the spool file path."""
    proc = subprocess.Popen([sys.executable, __file__, spool, run_id, str(rank), mode])
    path = os.path.join(spool, run_id, "a0", f"rank{rank:05d}-{proc.pid}.jsonl")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if (
            os.path.exists(path)
            and os.path.getsize(path) > 0
            and b"steps" in open(path, "rb").read()
        ):
            return proc, path
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"rank process {rank} did not register {path}")


def main() -> None:
    spool, run_id, rank, mode = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    folder = os.path.join(spool, run_id, "a0")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"rank{rank:05d}-{os.getpid()}.jsonl")
    out = open(path, "a")  # noqa: SIM115 - lives as long as the process

    def write(rec: dict) -> None:
        out.write(json.dumps(rec, separators=(",", ":")) + "\n")
        out.flush()

    write({"t": "_header", "run_id": run_id, "attempt": 0, "rank": rank})
    write({"t": "steps", "step": 0, "start_ns": time.time_ns(), "end_ns": time.time_ns()})
    move = path + ".move"

    def wait_for_peer() -> None:
        while not os.path.exists(move):
            write(
                {
                    "t": "progress",
                    "ts_ns": time.time_ns(),
                    "step": 1,
                    "group_id": "g",
                    "issued_seq": 5,
                    "completed_seq": 4,
                }
            )
            time.sleep(0.2)

    def train_loop() -> None:
        step = 1
        while True:
            write(
                {"t": "steps", "step": step, "start_ns": time.time_ns(), "end_ns": time.time_ns()}
            )
            step += 1
            time.sleep(0.2)
            if mode == "stuck" and not os.path.exists(move):
                wait_for_peer()

    if mode == "stuck":
        wait_for_peer()
    train_loop()


if __name__ == "__main__":
    main()
