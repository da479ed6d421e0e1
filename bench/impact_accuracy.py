"""How right is a finding's impact? Reported against measured, on real reference-trainer
runs (8 ranks, DP2 x TP2 x PP2, gloo on CPU or NCCL on 8 GPUs, with the hooks).

Each case is one faulty run and the same job clean (its twin, run right after it, or
earlier in the same record where cases share it). The true impact of the case's faults is measured two ways:

- *twin*: how much shorter the clean twin's mean job step is over the same steps (from
  the first fault's onset on): ``100 * (1 - mean_clean / mean_faulty)``;
- *before/after* (faults that start late): the run's own mean job step from the onset
  against its median job step before it (warm-up step 0 left out),
  ``100 * (1 - median_before / mean_after)``.

The reported impact is the sum over the analysis' findings that cost step time
(stragglers, slow links, transient stragglers; for the uneven-split cases, whose twins
are the other layer splits, the ``pipeline_imbalance`` finding; with several twins the
true impact is the largest gain among them). The error is reported minus true
(twin), in points. Prints one row per case, then the median and largest absolute error.
Beside each, ``peers x``: the healthy ranks' compute a step in the faulty run over the
same ranks' in the clean twin (1.00: they computed as fast; the twin's gain then holds no
speed-up of theirs that the run's own records cannot show).

Three modes, so the jobs can run on a machine without chdb and be analyzed here:

    python bench/impact_accuracy.py record  --work DIR [--steps 20] [--cases a,b] [--device cpu]
    python bench/impact_accuracy.py analyze --work DIR
    python bench/impact_accuracy.py [--home /tmp/impact] [--steps 20] [--cases a,b]   # both

``record`` runs each case and its twins with the hooks writing the spool only (no agent,
no store: nothing imports chdb), quietly (output to per-run logs), and keeps in ``DIR``:
``spool/`` (the runs' spool segments), ``summaries/RUN.json`` (the trainer's summary:
every rank's measured step times), ``logs/RUN.log``, and ``runs.json`` (case, role,
run id, faults, trainer flags, exit code); a second ``record`` into the same ``DIR``
adds to it (one case per device-tool command fits its 10-minute limit). ``analyze``
ships ``DIR/spool`` into the chdb store ``DIR/store`` (``ranksight agent --once
--keep-spool``) and prints the table. ``bench/gpu_session.sh`` passes ``--work`` and
``--store`` (ignored here) to the script it runs.

Job step: first rank's start to last rank's end of one step (README). Results go in
bench/RESULTS.md with the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass

from ranksight.faultmatrix import SHAPE
from ranksight.ground import env as rs_env
from ranksight.launcher import processes as launch


@dataclass(frozen=True, slots=True)
class Case:
    """One case: its faults (reference_trainer/faults.py specs) and trainer flags, and its
    twins' flags."""

    faults: tuple[str, ...]
    args: tuple[str, ...] = ()
    twins: tuple[tuple[str, ...], ...] = ((),)
    """Trainer flags of each twin (the same job without the faults, or another layer
    split): the true impact is the largest gain any twin shows, the best counterfactual
    measured."""
    kinds: tuple[str, ...] = ("straggler", "slow_communication", "transient_straggler")
    """Finding kinds whose impacts are summed as the reported impact."""


_SPLIT = ("--layers", "4")
_SPLITS = {s: (*_SPLIT, "--layer-split", s) for s in ("3,1", "2,2", "1,3")}
CASES: dict[str, Case] = {
    "slow-late": Case(("slow:rank=5,factor=2,from_step=8",)),
    "slow-early": Case(("slow:rank=5,factor=2,from_step=1",)),
    "slow-early-stage0": Case(("slow:rank=1,factor=2,from_step=1",)),
    "slow-early-mild": Case(("slow:rank=5,factor=1.5,from_step=1",)),
    "two-slow-early": Case(
        ("slow:rank=0,factor=1.7,from_step=1", "slow:rank=6,factor=1.7,from_step=1")
    ),
    "slow-very-late": Case(("slow:rank=5,factor=3,from_step=12",)),
    "two-slow": Case(("slow:rank=2,factor=2,from_step=6", "slow:rank=5,factor=2,from_step=6")),
    "slow+dp-link-late": Case(
        ("slow:rank=5,factor=2,from_step=8", "slow_link:rank=1,delay_ms=200,group=dp,from_step=10")
    ),
    "pp-link-no-cost": Case(("slow_link:rank=2,delay_ms=5,group=pp,from_step=6",)),
    "data-stall-late": Case(("data_stall:rank=3,delay_ms=400,from_step=8",)),
    "gc-pauses": Case(("gc_pauses:delay_ms=2500,every=3,from_step=4",)),
    "uneven-split": Case(
        (),
        args=_SPLITS["3,1"],
        twins=(_SPLITS["2,2"], _SPLITS["1,3"]),
        kinds=("pipeline_imbalance",),
    ),
    "uneven-split-13": Case(
        (),
        args=_SPLITS["1,3"],
        twins=(_SPLITS["2,2"], _SPLITS["3,1"]),
        kinds=("pipeline_imbalance",),
    ),
}
"""Case name -> Case: single and combined faults, early and late, and uneven splits (the
4 layers over 2 stages; the twins are the other two splits)."""


def run_job(work: str, run_id: str, faults, args, steps: int, device: str, store_url=None) -> int:
    """Run one job with ``faults`` and trainer flags ``args``, hooks writing
    ``work/spool`` (and an agent shipping it to ``store_url``, if given); returns its exit
    code. Its summary goes to ``work/summaries/RUN.json``, its output to ``work/logs``."""
    spool, logs = os.path.join(work, "spool"), os.path.join(work, "logs")
    summaries = os.path.join(work, "summaries")
    for d in (spool, logs, summaries):
        os.makedirs(d, exist_ok=True)
    job_env = {**os.environ, rs_env.RUN_ID: run_id, rs_env.SPOOL_DIR: spool,
               rs_env.LEVEL: "default", "OMP_NUM_THREADS": "1"}  # fmt: skip
    agent = None
    if store_url is not None:
        job_env = launch.job_env(run_id, spool, store_url)
        agent = launch.start_agent(spool, store_url, job_env, os.path.join(logs, "agent.log"))
    extra = [*args, "--device", device, "--summary", os.path.join(summaries, f"{run_id}.json")]
    cmd = launch.trainer_cmd(
        **SHAPE, steps=steps, run_id=run_id, inject=list(faults) or ["none"], extra=extra
    )
    try:
        with open(os.path.join(logs, f"{run_id}.log"), "w") as log:
            return subprocess.run(cmd, env=job_env, stdout=log, stderr=subprocess.STDOUT).returncode
    finally:
        if agent is not None:
            launch.stop(agent)


def record(work: str, names: list[str], steps: int, device: str, store_url=None) -> list[dict]:
    """Run each case of ``names`` and then its twins; add them to ``work/runs.json``. A job
    already recorded in ``work`` with the same faults, flags, steps and device (the clean
    twin most cases share, a layer split another case runs) is not run again: the case
    points at that run."""
    path = os.path.join(work, "runs.json")
    os.makedirs(work, exist_ok=True)
    runs = json.load(open(path)) if os.path.exists(path) else []
    done = {_job_key(r["faults"] if role == "case_run" else [], r_run["args"], r["steps"],
                     r["device"]): r_run
            for r in runs for role, r_run in _roles(r)}  # fmt: skip
    for name in names:
        case = CASES[name]
        pair: dict = {"name": name, "steps": steps, "device": device, "faults": list(case.faults)}
        jobs = [("case_run", case.faults, case.args)] + [("twin", (), t) for t in case.twins]
        for role, faults, args in jobs:
            key = _job_key(list(faults), list(args), steps, device)
            if key not in done:
                run_id = f"impact-{role.split('_')[0]}-{uuid.uuid4().hex[:8]}"
                t0 = time.monotonic()
                rc = run_job(work, run_id, faults, args, steps, device, store_url)
                done[key] = {"run_id": run_id, "args": list(args), "rc": rc,
                             "wall_s": round(time.monotonic() - t0, 1)}  # fmt: skip
                print(f"recorded {name} {role}: {run_id} exit {rc}", flush=True)
            if role == "case_run":
                pair[role] = done[key]
            else:
                pair.setdefault("twins", []).append(done[key])
        runs.append(pair)
        with open(path, "w") as f:
            json.dump(runs, f, indent=1)
    with open(os.path.join(work, "machine.json"), "w") as f:
        json.dump(_machine(device), f, indent=1)
    return runs


def _job_key(faults: list[str], args: list[str], steps: int, device: str) -> str:
    return json.dumps([sorted(faults), list(args), steps, device])


def _roles(pair: dict) -> list[tuple[str, dict]]:
    """(role, run) of a runs.json entry: its case run and each twin (``twin`` in records
    made before cases had several)."""
    twins = pair.get("twins") or [pair["twin"]]
    return [("case_run", pair["case_run"])] + [("twin", t) for t in twins]


def _machine(device: str) -> dict:
    out = {"host": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version(),
           "device": device}  # fmt: skip
    try:
        import torch

        out["torch"] = torch.__version__
        if device == "cuda":
            out["gpu"] = torch.cuda.get_device_name(0)
    except Exception as exc:  # the record stays usable without it
        out["torch"] = f"unknown ({exc})"
    return out


def mean_job_step_ns(store, run_id: str, first: int) -> float:
    """Mean job step (ns) of the steps from ``first`` on."""
    from ranksight.analyzer.queries import load_run

    s = load_run(store, run_id).steps
    g = s[s["step"] >= first].groupby("step")
    return float((g["end_ns"].max() - g["start_ns"].min()).mean())


def onset_of(faults: tuple[str, ...]) -> int:
    """The first step any of ``faults`` is active."""
    return min(int(f.split("from_step=")[1].split(",")[0]) for f in faults)


def before_after_pct(store, run_id: str, onset: int) -> float | None:
    """``100 * (1 - median_before / mean_after)`` of the run's own job steps (step 0, the
    warm-up, left out); None with fewer than two steps before ``onset``."""
    from ranksight.analyzer.queries import load_run

    s = load_run(store, run_id).steps
    g = s.groupby("step")
    wall = (g["end_ns"].max() - g["start_ns"].min()).iloc[1:]
    before, after = wall[wall.index < onset], wall[wall.index >= onset]
    if len(before) < 2 or after.empty:
        return None
    return 100.0 * (1.0 - float(before.median()) / float(after.mean()))


def faulty_ranks(faults: tuple[str, ...]) -> set[int]:
    """The ranks ``faults`` name (``rank=N``); a fault without one (GC pauses on every
    rank) names none."""
    out = set()
    for f in faults:
        for kv in f.split(":", 1)[-1].split(","):
            if kv.startswith("rank="):
                out.add(int(kv.split("=", 1)[1]))
    return out


def compute_per_step_ms(store, run_id: str, first: int, leave_out: set[int]) -> float:
    """Median over the ranks not in ``leave_out`` of their compute self time a step
    (forward + backward + optimizer, ms) from step ``first`` on."""
    per = store.query(
        "SELECT rank, sum(end_ns - start_ns - wait_ns) / uniqExact(step) AS ns FROM phases "
        "WHERE run_id = %(run)s AND step >= %(first)s "
        "AND phase IN ('forward', 'backward', 'optimizer') GROUP BY rank",
        {"run": run_id, "first": first},
    )
    per = per[~per["rank"].isin(sorted(leave_out))]["ns"]
    return float(per.median()) / 1e6 if len(per) else float("nan")


def ship(work: str) -> str:
    """Store ``work/spool`` into the chdb store ``work/store`` (once); returns its URL."""
    from ranksight.store import open_store

    store_url = os.path.join(work, "store")
    open_store(store_url).init_schema()
    cmd = [sys.executable, "-m", "ranksight.cli", "agent", "--once", "--keep-spool",
           "--collectors", "none", "--spool", os.path.join(work, "spool"), "--store", store_url]  # fmt: skip
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return store_url


def analyze_work(work: str, store_url: str | None = None) -> list[float]:
    """Print the error table of the runs in ``work/runs.json``; returns the errors."""
    from ranksight.analyzer import analyze
    from ranksight.store import open_store

    runs = json.load(open(os.path.join(work, "runs.json")))
    store = open_store(store_url or ship(work))
    print("machine:", json.dumps(json.load(open(os.path.join(work, "machine.json")))))
    print(
        f"{'case':18} {'reported %':>10} {'twin %':>7} {'b/a %':>6} {'error':>7} "
        f"{'peers x':>7}  method"
    )
    errors = []
    for pair in runs:
        case = CASES[pair["name"]]
        run_id = pair["case_run"]["run_id"]
        first = max(1, onset_of(case.faults)) if case.faults else 1
        faulty = mean_job_step_ns(store, run_id, first)
        true = max(
            100.0 * (1.0 - mean_job_step_ns(store, t["run_id"], first) / faulty)
            for role, t in _roles(pair)
            if role == "twin"
        )
        own = before_after_pct(store, run_id, first) if case.faults else None
        found = [f for f in analyze(store, run_id, save=False).findings if f.kind in case.kinds]
        reported = sum(f.impact_pct for f in found)
        methods = ",".join(str(f.evidence.get("impact_method", f.kind)) for f in found) or "-"
        errors.append(reported - true)
        ba = f"{own:6.1f}" if own is not None else f"{'-':>6}"
        # the healthy ranks' compute in the faulty run over the same ranks' in the (first)
        # twin: above 1, the faulty run's peers computed slower than the twin's, and the
        # twin's gain holds that speed-up, which no counterfactual of the run's own
        # records can see (not for layer-split twins, whose work differs)
        twin = next(t for role, t in _roles(pair) if role == "twin")
        left = faulty_ranks(case.faults)
        speed = (
            compute_per_step_ms(store, run_id, first, left)
            / compute_per_step_ms(store, twin["run_id"], first, left)
            if left and not twin["args"]
            else float("nan")
        )
        sp = f"{speed:7.2f}" if speed == speed else f"{'-':>7}"
        print(
            f"{pair['name']:18} {reported:10.1f} {true:7.1f} {ba} {reported - true:+7.1f} "
            f"{sp}  {methods}"
        )
    if errors:
        absolute = [abs(e) for e in errors]
        print(f"median |error| {statistics.median(absolute):.1f} points, max {max(absolute):.1f}")
    return errors


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mode", nargs="?", choices=("record", "analyze", "all"), default="all")
    ap.add_argument("--work", default=None, help="folder of the record (record, analyze)")
    ap.add_argument("--home", default="/tmp/ranksight-impact", help="folder of a one-shot run")
    ap.add_argument("--store", default=None, help="ignored (bench/gpu_session.sh passes it)")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    args = ap.parse_args(argv)
    names = [c for c in args.cases.split(",") if c]
    unknown = [c for c in names if c not in CASES]
    if unknown:
        ap.error(f"--cases: unknown {unknown}; known: {', '.join(CASES)}")
    work = args.work or args.home
    if args.mode == "record":
        record(work, names, args.steps, args.device)
        return 0
    if args.mode == "analyze":
        if not os.path.exists(os.path.join(work, "runs.json")):
            ap.error(f"--work {work}: no runs.json (record into it first)")
        analyze_work(work)
        return 0
    from ranksight.store import open_store

    store_url = os.path.join(work, "store")
    open_store(store_url).init_schema()
    record(work, names, args.steps, args.device, store_url)
    analyze_work(work, store_url)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
