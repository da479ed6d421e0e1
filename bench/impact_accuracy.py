"""How right is a finding's impact? Reported against measured, on real reference-trainer
runs (8 CPU ranks, DP2 x TP2 x PP2, gloo, with the hooks and a node agent).

Each case is one faulty run and the same job clean (its twin), both in one store. The
true impact of the case's faults is how much shorter the clean twin's mean job step is
over the same steps (from the first fault's onset on):
``100 * (1 - mean_clean / mean_faulty)``. The reported impact is the sum over the
analysis' findings that cost step time (stragglers, slow links, transient stragglers).
The error is reported minus true, in points. Prints one row per case, then the median and
largest absolute error.

    python bench/impact_accuracy.py [--home /tmp/impact] [--steps 16] [--cases a,b]

Job step: first rank's start to last rank's end of one step (README). Results go in
bench/RESULTS.md with the machine.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import uuid

from ranksight import launch
from ranksight.analyzer import analyze
from ranksight.analyzer.impact import COSTS_STEP_TIME
from ranksight.analyzer.queries import load_run
from ranksight.faultmatrix import SHAPE
from ranksight.store import open_store

CASES: dict[str, tuple[str, ...]] = {
    "slow-late": ("slow:rank=5,factor=2,from_step=8",),
    "slow-early": ("slow:rank=5,factor=2,from_step=1",),
    "two-slow": ("slow:rank=2,factor=2,from_step=6", "slow:rank=5,factor=2,from_step=6"),
    "pp-link-no-cost": ("slow_link:rank=2,delay_ms=5,group=pp,from_step=6",),
    "data-stall-late": ("data_stall:rank=3,delay_ms=400,from_step=8",),
    "gc-pauses": ("gc_pauses:delay_ms=2500,every=3,from_step=4",),
}
"""Case -> fault specs (reference_trainer/faults.py); single and combined, early and late."""


def run_job(store_url: str, home: str, faults: tuple[str, ...], steps: int) -> str:
    """Run one job with ``faults`` into ``store_url``; returns its run id."""
    run_id = f"impact-{uuid.uuid4().hex[:8]}"
    spool, logs = os.path.join(home, "spool"), os.path.join(home, "logs")
    os.makedirs(logs, exist_ok=True)
    env = launch.job_env(run_id, spool, store_url)
    agent = launch.start_agent(spool, store_url, env, os.path.join(logs, "agent.log"))
    try:
        with open(os.path.join(logs, f"{run_id}.log"), "w") as log:
            cmd = launch.trainer_cmd(
                **SHAPE, steps=steps, run_id=run_id, inject=list(faults) or ["none"]
            )
            subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, check=False)
    finally:
        launch.stop(agent)
    return run_id


def mean_job_step_ns(store, run_id: str, first: int) -> float:
    """Mean job step (ns) of the steps from ``first`` on."""
    s = load_run(store, run_id).steps
    g = s[s["step"] >= first].groupby("step")
    return float((g["end_ns"].max() - g["start_ns"].min()).mean())


def onset_of(faults: tuple[str, ...]) -> int:
    """The first step any of ``faults`` is active."""
    return min(int(f.split("from_step=")[1].split(",")[0]) for f in faults)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--home", default="/tmp/ranksight-impact")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--cases", default=",".join(CASES))
    args = ap.parse_args(argv)
    names = [c for c in args.cases.split(",") if c]
    store_url = os.path.join(args.home, "store")
    store = open_store(store_url)
    store.init_schema()
    clean = run_job(store_url, args.home, (), args.steps)
    print(f"machine: {platform.node()}, {os.cpu_count()} CPUs, Python {platform.python_version()}")
    print(f"{'case':18} {'reported %':>10} {'true %':>8} {'error':>7}  method")
    errors = []
    for name in names:
        faults = CASES[name]
        run_id = run_job(store_url, args.home, faults, args.steps)
        first = max(1, onset_of(faults))
        true = 100.0 * (
            1.0 - mean_job_step_ns(store, clean, first) / mean_job_step_ns(store, run_id, first)
        )
        found = [
            f for f in analyze(store, run_id, save=False).findings if f.kind in COSTS_STEP_TIME
        ]
        reported = sum(f.impact_pct for f in found)
        methods = ",".join(str(f.evidence.get("impact_method", f.kind)) for f in found) or "-"
        errors.append(reported - true)
        print(f"{name:18} {reported:10.1f} {true:8.1f} {reported - true:+7.1f}  {methods}")
    if errors:
        absolute = [abs(e) for e in errors]
        print(f"median |error| {statistics.median(absolute):.1f} points, max {max(absolute):.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
