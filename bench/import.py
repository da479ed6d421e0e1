"""Import throughput and peak memory for large Kineto traces.

Builds N rank traces of about SIZE MB each by repeating a real trace's events
(``../shared/realdata/kineto_hta/nccl_parser_config_nccl_data.json.gz``, shifted in time
per copy, NCCL kernels included), then imports them into a fresh chdb store in a child
process and reports MB/s (uncompressed JSON) and the child's peak RSS, next to the peak
RSS of ``json.load`` of one trace measured the same way.

Run: flock /tmp/ranksight-cpu.lock python bench/import.py [--ranks 8] [--mb 200] [--memory-mb 256]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

SRC = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "realdata", "kineto_hta",
                   "nccl_parser_config_nccl_data.json.gz")  # fmt: skip


def make_trace(path: str, rank: int, mb: int) -> int:
    """Write a ~``mb`` MB trace for ``rank``; returns its size in bytes."""
    with gzip.open(SRC, "rt") as f:
        top = json.load(f)
    events = top.pop("traceEvents")
    top["distributedInfo"] = {**top.get("distributedInfo", {}), "rank": rank, "world_size": 8}
    span = max(e.get("ts", 0) + e.get("dur", 0) for e in events) - min(
        e.get("ts", 0) for e in events
    )
    lines = [json.dumps(e) for e in events]
    size = 0
    with open(path, "w") as out:
        out.write(json.dumps(top)[:-1] + ', "traceEvents": [\n')
        copy = 0
        while size < mb << 20:
            shift = copy * (span + 1000)
            for e, text in zip(events, lines, strict=True):
                if "ts" in e:
                    text = text.replace(
                        f'"ts": {json.dumps(e["ts"])}', f'"ts": {e["ts"] + shift}', 1
                    )
                    if "ProfilerStep#" in e.get("name", ""):
                        text = text.replace("ProfilerStep#", f"ProfilerStep#{copy}0")
                out.write(("," if size else "") + text + "\n")
                size += len(text) + 2
            copy += 1
        out.write("]}\n")
    return os.path.getsize(path)


def child(mode: str, paths: list[str], memory_mb: int) -> None:
    if mode == "json":
        with open(paths[0]) as f:
            json.load(f)
    else:
        from ranksight.importer import ImportConfig, import_paths
        from ranksight.store import open_store

        store = open_store(tempfile.mkdtemp(prefix="bench-import-"))
        store.init_schema()
        import_paths(store, paths, ImportConfig(run_id="bench", memory_mb=memory_mb))
    print(json.dumps({"peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


def measure(mode: str, paths: list[str], memory_mb: int) -> dict:
    t = time.perf_counter()
    out = subprocess.run([sys.executable, __file__, "--child", mode, "--memory-mb", str(memory_mb), *paths],
                         capture_output=True, text=True, check=True)  # fmt: skip
    return {**json.loads(out.stdout.strip().splitlines()[-1]), "s": time.perf_counter() - t}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--mb", type=int, default=200)
    p.add_argument("--memory-mb", type=int, default=256)
    p.add_argument("--child", default=None)
    p.add_argument("paths", nargs="*")
    a = p.parse_args()
    if a.child:
        return child(a.child, a.paths, a.memory_mb)
    tmp = tempfile.mkdtemp(prefix="bench-kineto-")
    paths = [os.path.join(tmp, f"trace_rank{r}.json") for r in range(a.ranks)]
    total = sum(make_trace(path, r, a.mb) for r, path in enumerate(paths)) / (1 << 20)
    imp = measure("import", paths, a.memory_mb)
    js = measure("json", paths[:1], a.memory_mb)
    print(f"{a.ranks} traces, {total:.0f} MB in all ({total / a.ranks:.0f} MB each)")
    print(f"ranksight import: {imp['s']:.1f} s, {total / imp['s']:.1f} MB/s, peak RSS {imp['peak_rss_mb']:.0f} MB "
          f"(budget {a.memory_mb} MB)")  # fmt: skip
    print(f"json.load of ONE trace: {js['s']:.1f} s, peak RSS {js['peak_rss_mb']:.0f} MB")
    print(f"ratio: import peak / json.load-one peak = {imp['peak_rss_mb'] / js['peak_rss_mb']:.2f}")


if __name__ == "__main__":
    main()
