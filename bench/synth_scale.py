"""Synthetic-run generator: time, rows and peak memory against job size, on this machine.

For each size it runs ``ranksight.synthetic.write_synthetic`` in a fresh child process
(so the peak RSS is that size's alone) into a fresh embedded store (or a fresh database
of ``--clickhouse URL``), with one slow rank injected, and prints rows, seconds, rows per
second and peak RSS, with ratios to the smallest size.

    python bench/synth_scale.py --sizes 1024,4096,16384 --steps 100
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import uuid

CHILD = """
import json, resource, sys
from ranksight.store import open_store
from ranksight.synthetic import SynthConfig, write_synthetic
url, ranks, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
store = open_store(url)
store.init_schema()
cfg = SynthConfig(ranks=ranks, steps=steps,
                  faults=(f"slow:rank={ranks // 3},factor=1.5,from_step={steps // 5}",))
res = write_synthetic(store, cfg)
print(json.dumps({"rows": sum(res.rows.values()), "collectives": res.rows["collectives"],
                  "seconds": res.seconds,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def one(url: str, ranks: int, steps: int) -> dict:
    """Generate one run in a child process; returns its measurements."""
    out = subprocess.run(
        [sys.executable, "-c", CHILD, url, str(ranks), str(steps)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return {"ranks": ranks, "steps": steps, **json.loads(out.stdout.strip().splitlines()[-1])}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="1024,4096,16384")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--clickhouse", default=None, help="clickhouse://host:port (a db is made)")
    a = p.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as work:
        for ranks in (int(x) for x in a.sizes.split(",")):
            if a.clickhouse:
                url = f"{a.clickhouse.rstrip('/')}/synth_{uuid.uuid4().hex[:8]}"
            else:
                url = f"{work}/store{ranks}"
            rows.append(one(url, ranks, a.steps))
            r, base = rows[-1], rows[0]
            print(
                f"{r['ranks']:>6} ranks x {r['steps']} steps: {r['rows'] / 1e6:6.1f} M rows "
                f"({r['collectives'] / 1e6:.1f} M collectives), {r['seconds']:6.1f} s, "
                f"{r['rows'] / r['seconds'] / 1e6:.2f} M rows/s, peak RSS {r['peak_rss_mb']:.0f} MB"
                f"; x{r['rows'] / base['rows']:.1f} rows, x{r['seconds'] / base['seconds']:.1f} "
                "time vs the smallest",
                flush=True,
            )


if __name__ == "__main__":
    main()
