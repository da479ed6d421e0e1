"""What the bounded what-if replay and the GPU cause queries add to an analysis.

For each size it writes one synthetic run (``ranksight.synthetic``, one slow rank) into a
fresh chdb store, then analyzes it in child processes, alternately with the replay and GPU
queries on (``RunData.fetch_slice`` / ``fetch_gpu`` as ``load_run`` sets them) and off
(both None: the excess-time estimate), ``--repeat`` times each, and prints the median
wall times, their ratio, peak RSS and the impact each way, beside the true impact: the
mean step time of the same run written without the fault (same seed, same noise).

    python bench/analyzer_replay.py --sizes 1024,4096 --steps 100
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

CHILD = """
import dataclasses, json, resource, sys, time
from ranksight.store import open_store
from ranksight.analyzer import diagnose, load_run
store = open_store(sys.argv[1])
t0 = time.perf_counter()
data = load_run(store, sys.argv[2])
if sys.argv[3] == "off":
    data = dataclasses.replace(data, fetch_slice=None, fetch_gpu=None)
a = diagnose(data)
f = [x for x in a.findings if x.kind == "straggler"]
print(json.dumps({"seconds": time.perf_counter() - t0,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "impact": f[0].impact_pct if f else None,
                  "replayed": bool(f and "whatif" in f[0].evidence)}))
"""


def child(url: str, run_id: str, mode: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, url, run_id, mode], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def one(ranks: int, steps: int, repeat: int, work: str) -> dict:
    """Write a run of ``ranks`` x ``steps``; analyze it with the replay on and off."""
    from ranksight.store import open_store
    from ranksight.synthetic import SynthConfig, write_synthetic

    url = os.path.join(work, f"store{ranks}")
    store = open_store(url)
    store.init_schema()
    onset = steps // 5
    fault = f"slow:rank={ranks // 3},factor=1.5,from_step={onset}"
    run_id = write_synthetic(store, SynthConfig(ranks=ranks, steps=steps, faults=(fault,))).run_id
    clean = write_synthetic(store, SynthConfig(ranks=ranks, steps=steps)).run_id
    true = 100.0 * (1.0 - mean_step_ns(store, clean, onset) / mean_step_ns(store, run_id, onset))
    runs = {"on": [], "off": []}
    for _ in range(repeat):
        for mode in ("off", "on"):
            runs[mode].append(child(url, run_id, mode))
    med = {m: statistics.median(r["seconds"] for r in v) for m, v in runs.items()}
    rss = {m: max(r["peak_rss_mb"] for r in v) for m, v in runs.items()}
    return {
        "ranks": ranks,
        "steps": steps,
        "seconds": med,
        "peak_rss_mb": rss,
        "impact": {m: v[0]["impact"] for m, v in runs.items()},
        "replayed": runs["on"][0]["replayed"],
        "true": true,
    }


def mean_step_ns(store, run_id: str, first: int) -> float:
    """Mean wall time of the steps from ``first`` on (first start to last end over ranks);
    the same seed gives the same timing noise, so a clean twin measures the true cost."""
    rows = store.query(
        "SELECT step, max(end_ns) - min(start_ns) AS span FROM steps "
        "WHERE run_id = %(r)s AND step >= %(s)s GROUP BY step",
        {"r": run_id, "s": first},
    )
    return float(rows["span"].mean())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="1024,4096")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--repeat", type=int, default=3)
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as work:
        for ranks in (int(x) for x in a.sizes.split(",")):
            r = one(ranks, a.steps, a.repeat, work)
            s, m = r["seconds"], r["peak_rss_mb"]
            print(
                f"{ranks:>6} ranks x {a.steps} steps: analysis {s['off']:.2f} s without the "
                f"replay, {s['on']:.2f} s with it (x{s['on'] / s['off']:.2f}); peak RSS "
                f"{m['off']:.0f} / {m['on']:.0f} MB; impact {r['impact']['off']}% estimated, "
                f"{r['impact']['on']}% replayed (replay used: {r['replayed']}), "
                f"{r['true']:.1f}% true (a clean twin run)",
                flush=True,
            )


if __name__ == "__main__":
    main()
