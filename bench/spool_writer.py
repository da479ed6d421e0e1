"""What the hooks' spool writer costs the training process: the binary columnar spool
against the JSON lines it replaced, side by side in one run.

1. Encoding: CPU µs per record of ``spool_format.encode`` and of compact ``json.dumps``
   lines (the earlier writer), on the same hook-shaped records (``bench/ingest.py``'s mix).
2. A training thread: a step of fixed pure-Python work (about ``--step-ms``) that hands
   ``--records-per-step`` records to a real ``SpoolWriter`` (its writer thread drains
   every 0.25 s, as in the hooks), in rounds of: no writer (records discarded), the JSON
   writer, the binary writer. Mean step time of each and its ratio to no writer; the
   process's CPU% and RSS at the end of each run. The writer thread takes the GIL from
   the training thread while it encodes, so its cost shows as longer steps (the mean
   step: a drain lands on one step in about 60).

Run::

    python bench/spool_writer.py [--steps 400] [--records-per-step 200] [--step-ms 4]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import sys
import tempfile
import time

import psutil

sys.path.insert(0, os.path.dirname(__file__))
from ingest import records  # noqa: E402

from ranksight.trainer_hooks import spool_format as sf  # noqa: E402
from ranksight.trainer_hooks.spool import SpoolWriter, spool_path  # noqa: E402


def json_lines(recs: list[dict]) -> bytes:
    """The earlier writer's encoding: one compact JSON object a line."""
    return ("\n".join(json.dumps(r, separators=(",", ":")) for r in recs) + "\n").encode()


class JsonSpoolWriter(SpoolWriter):
    """The writer with the earlier JSON-lines encoding, for comparison."""

    def _drain(self) -> None:
        buf = self._buf
        recs = [buf.popleft() for _ in range(len(buf))]
        if recs:
            data = json_lines(recs)
            os.write(self._fd, data)
            self._size += len(data)
            self.records += len(recs)


class NullWriter:
    """Takes records and drops them: the training loop's cost without a writer."""

    records = dropped = 0

    def put(self, record: dict) -> None:
        pass

    def close(self) -> None:
        pass


def encode_cost(recs: list[dict], rounds: int = 5) -> dict[str, float]:
    """Best-of-``rounds`` CPU µs per record of each encoding."""
    out = {}
    for name, fn in (("JSON lines", json_lines), ("binary columns", sf.encode)):
        best = min(_cpu(fn, recs) for _ in range(rounds))
        out[name] = best / len(recs) * 1e6
        out[name + " bytes"] = len(fn(recs)) / len(recs)
    return out


def _cpu(fn, arg) -> float:
    c0 = time.process_time()
    fn(arg)
    return time.process_time() - c0


def calibrate(step_ms: float) -> int:
    """Iterations of the step's work loop that take about ``step_ms`` here."""
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < 0.2:
        _work(1000)
        n += 1000
    return int(n * step_ms / 200)


def _work(n: int) -> int:
    """Pure-Python work holding the GIL (like a training loop's Python side)."""
    x = 0
    for i in range(n):
        x += i * i
    return x


def train(writer, steps: int, per_step: int, work: int, pool: list[dict]) -> dict:
    """Step times of a loop of fixed work that hands records to ``writer``."""
    times, k = [], 0
    r0, w0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    for _ in range(steps):
        t0 = time.perf_counter()
        _work(work)
        for _ in range(per_step):
            writer.put(dict(pool[k % len(pool)]))  # the hooks build a dict per record
            k += 1
        times.append(time.perf_counter() - t0)
    writer.close()
    r1, w1 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    return {
        "median_ms": statistics.median(times) * 1e3,
        "mean_ms": statistics.fmean(times) * 1e3,
        "cpu_pct": 100 * cpu / (w1 - w0),
        "rss_mb": psutil.Process().memory_info().rss / 2**20,
        "dropped": writer.dropped,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--records-per-step", type=int, default=200)
    parser.add_argument("--step-ms", type=float, default=4.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    pool = list(records(0, 20_000, random.Random(0)))
    cost = encode_cost(pool)
    print("encoding, CPU per record (best of 5, 20,000 hook-shaped records):")
    for name in ("JSON lines", "binary columns"):
        print(f"  {name}: {cost[name]:.2f} µs, {cost[name + ' bytes']:.0f} bytes")
    folder = tempfile.mkdtemp(prefix="ranksight-writer-")
    header = {"run_id": "bench", "attempt": 0, "rank": 0}
    results: dict[str, list[dict]] = {"none": [], "JSON lines": [], "binary columns": []}
    work = calibrate(args.step_ms)
    for r in range(args.rounds):
        for name in results:
            path = spool_path(folder, f"r{r}-{len(name)}", 0, 0)
            kw = dict(max_buffered=200_000, budget_bytes=8 << 30, flush_interval_s=0.25)
            writer = {
                "none": lambda: NullWriter(),
                "JSON lines": lambda p=path, k=kw: JsonSpoolWriter(p, header, **k),
                "binary columns": lambda p=path, k=kw: SpoolWriter(p, header, **k),
            }[name]()
            results[name].append(train(writer, args.steps, args.records_per_step, work, pool))
    rate = args.records_per_step / (args.step_ms / 1000)
    print(
        f"training thread: {args.step_ms} ms steps, {args.records_per_step} records a step "
        f"(about {rate:,.0f} records/s), {args.steps} steps x {args.rounds} rounds"
    )
    base = statistics.median(x["mean_ms"] for x in results["none"])
    print("| writer | mean step | ratio to none | median step | process CPU% | RSS | dropped |")
    print("|---|---|---|---|---|---|---|")
    for name, runs in results.items():
        mean = statistics.median(x["mean_ms"] for x in runs)
        med = statistics.median(x["median_ms"] for x in runs)
        cpu = statistics.median(x["cpu_pct"] for x in runs)
        print(
            f"| {name} | {mean:.3f} ms | {mean / base:.3f} | {med:.3f} ms | {cpu:.0f} | "
            f"{runs[-1]['rss_mb']:.0f} MB | {sum(x['dropped'] for x in runs)} |"
        )
    os.system(f"rm -rf {folder}")


if __name__ == "__main__":
    main()
