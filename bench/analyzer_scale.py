"""Analyzer time and peak memory against job size, on this machine.

For each size (ranks x steps) it writes one synthetic run (``ranksight.synthetic``: real
schema, DP x TP x PP, one slow rank injected) into a fresh embedded store (chdb), then
runs the analysis in a child process and reports its wall time, peak RSS (the store's
engine included) and whether it named the injected rank. Ratios between sizes show how
the cost grows.

    python bench/analyzer_scale.py --sizes 1024,4096,16384 --steps 100
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

CHILD = """
import json, resource, sys, time
from ranksight.store import open_store
from ranksight.analyzer import analyze
store = open_store(sys.argv[1])
t0 = time.perf_counter()
a = analyze(store, sys.argv[2], save=False)
print(json.dumps({"seconds": time.perf_counter() - t0,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "culprits": [f.culprit_rank for f in a.findings]}))
"""


def one(ranks: int, steps: int, work: str) -> dict:
    """Write one run of ``ranks`` x ``steps`` and analyze it; returns the measurements."""
    from ranksight.store import open_store
    from ranksight.synthetic import SynthConfig, write_synthetic

    url = os.path.join(work, f"store{ranks}")
    store = open_store(url)
    store.init_schema()
    slow = ranks // 3
    t0 = time.perf_counter()
    res = write_synthetic(
        store,
        SynthConfig(
            ranks=ranks,
            steps=steps,
            faults=(f"slow:rank={slow},factor=1.5,from_step={steps // 5}",),
        ),
    )
    write_s = time.perf_counter() - t0
    out = subprocess.run(
        [sys.executable, "-c", CHILD, url, res.run_id], capture_output=True, text=True, check=True
    )
    doc = json.loads(out.stdout.strip().splitlines()[-1])
    return {
        "ranks": ranks,
        "steps": steps,
        "rows": sum(res.rows.values()),
        "write_s": write_s,
        "right": doc["culprits"] == [slow],
        **doc,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="1024,4096,16384")
    p.add_argument("--steps", type=int, default=100)
    a = p.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as work:
        for ranks in (int(x) for x in a.sizes.split(",")):
            r = one(ranks, a.steps, work)
            results.append(r)
            print(
                f"{r['ranks']:>6} ranks x {r['steps']} steps: {r['rows'] / 1e6:6.1f} M rows, "
                f"write {r['write_s']:6.1f} s, analyze {r['seconds']:6.1f} s, "
                f"peak RSS {r['peak_rss_mb']:7.0f} MB, culprit right: {r['right']}",
                flush=True,
            )
    base = results[0]
    for r in results[1:]:
        print(
            f"x{r['ranks'] / base['ranks']:.0f} ranks -> analysis x{r['seconds'] / base['seconds']:.1f} "
            f"time, x{r['peak_rss_mb'] / base['peak_rss_mb']:.1f} memory"
        )


if __name__ == "__main__":
    main()
