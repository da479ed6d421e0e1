"""Step time of the reference trainer at each hook level, side by side in one run.

Runs the reference trainer with ``--hooks off``, ``default`` and ``detailed`` in rotating
order, round after round, reads each run's per-rank step times from its ``--summary``,
drops the first ``--warmup`` steps, and prints the median step time of each level and its
ratio to ``off``. On CPU it also times one full ``ranksight demo`` (install excluded).
Results go to bench/RESULTS.md by hand, with the machine.

    python bench/hooks_overhead.py --pairs 3 --steps 12                  # 8 gloo ranks
    python bench/hooks_overhead.py --device cuda --nproc 2 --dp 2 --tp 1 --pp 1 \
        --extra="--dtype bf16 --d-model 2048 --layers 16 --heads 16 --seq-len 1024"
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

VARIANTS = {"default-nodevice": ("default", {"RANKSIGHT_DEVICE_TIMING": "0"})}
"""Extra level names: a hook level run with some environment (e.g. CUDA-event timing off)."""


def run_trainer(level: str, a: argparse.Namespace, workdir: str) -> dict[str, list[float]]:
    """One torchrun of the trainer; returns step seconds per rank."""
    summary = os.path.join(workdir, f"summary-{level}-{time.time_ns()}.json")
    level, extra_env = VARIANTS.get(level, (level, {}))
    env = {**os.environ, "RANKSIGHT_HOME": workdir, "OMP_NUM_THREADS": "1", **extra_env}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={a.nproc}", "-m", "ranksight.reference_trainer.train",
           "--dp", str(a.dp), "--tp", str(a.tp), "--pp", str(a.pp), "--device", a.device,
           "--steps", str(a.steps), "--hooks", level, "--summary", summary, *a.extra.split()]  # fmt: skip
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with open(summary) as f:
        doc = json.load(f)
    return doc["step_seconds_by_rank"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pairs", type=int, default=3, help="rounds of off/default/detailed")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--warmup", type=int, default=2, help="leading steps dropped")
    p.add_argument("--no-demo", action="store_true", help="skip timing the demo")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--nproc", type=int, default=8, help="ranks (dp x tp x pp)")
    p.add_argument("--dp", type=int, default=2)
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--pp", type=int, default=2)
    p.add_argument("--extra", default="", help="more trainer flags, one string")
    p.add_argument(
        "--levels",
        default="off,default,detailed",
        help="comma-separated: off, default, detailed, default-nodevice (no CUDA events)",
    )
    a = p.parse_args()
    levels = tuple(a.levels.split(","))
    times: dict[str, list[float]] = {level: [] for level in levels}
    with tempfile.TemporaryDirectory() as work:
        for i in range(a.pairs):
            k = i % len(levels)
            for level in levels[k:] + levels[:k]:  # rotate the order each round
                by_rank = run_trainer(level, a, work)
                for secs in by_rank.values():
                    times[level] += secs[a.warmup :]
                print(
                    f"pair {i} {level}: median {statistics.median(times[level]) * 1e3:.0f} ms",
                    flush=True,
                )
        med = {level: statistics.median(times[level]) for level in levels}
        print(
            f"machine: {platform.node()} {os.cpu_count()} cores, {platform.processor() or platform.machine()}"
        )
        for level in levels:
            print(
                f"step time hooks {level:<9}: {med[level] * 1e3:.1f} ms "
                f"(median of {len(times[level])}), ratio to off {med[level] / med['off']:.3f}"
            )
        if not a.no_demo and a.device == "cpu":
            env = {**os.environ, "RANKSIGHT_HOME": work}
            t0 = time.monotonic()
            rc = subprocess.run(
                [sys.executable, "-m", "ranksight.cli", "demo"],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            ).returncode
            print(f"demo wall time          : {time.monotonic() - t0:.1f} s (exit code {rc})")


if __name__ == "__main__":
    main()
