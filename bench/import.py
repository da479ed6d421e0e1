"""Import throughput and peak memory for large Kineto traces, against the memory budget.

Builds N rank traces of about SIZE MB each (uncompressed JSON, in a temporary folder
under /tmp, removed at the end unless ``--keep``) by repeating a real trace's events
(``tests/data/realdata/kineto_hta/nccl_parser_config_nccl_data.json.gz``: an 8-GPU
training step's CPU ops, CUDA runtime calls, kernels, NCCL kernels with their metadata,
memcpys and flow events), each copy shifted in time past the previous one and renamed to
its own ``ProfilerStep#``, each rank shifted by a few microseconds. Then, each in a child
process of its own (peak RSS from getrusage), side by side in one run:

- the base: ``ranksight import`` of a 1 MB trace made the same way (the process with
  pandas, pyarrow, chdb and the store loaded, and no trace to speak of);
- ``ranksight import`` of all N traces at each ``--memory-mb`` budget, and of 2 of them
  at the first budget (does the peak grow with the input?);
- ``json.load`` of one trace (what reading a trace whole costs).

It prints MB/s (uncompressed JSON over the child's wall time) and peak RSS, and peak RSS
minus the base against the budget.

Run: flock /tmp/ranksight-cpu.lock python bench/import.py [--ranks 8] [--mb 200]
     [--memory-mb 64,256]

With ``--fr``: the fixed cost of answering on Flight Recorder dumps, against PyTorch's
own analyzer, ``python -m torch.distributed.flight_recorder.fr_trace DIR -p _dump_``
(the module torch ships). The 16 real dumps of ``nvrx_fr_dumps/gpu_error_1st``
(``tests/data/realdata/MANIFEST.md``; copied byte for byte) and 256, 1,024 and 4,096
ranks made from them (:func:`replicate_dump`), each tool in a child process of its own,
interleaved size by size and repeated: wall time and the child's peak RSS (``wait4``).
NVIDIA's FR analyzer (nvidia-resiliency-ext ``attribution``) is not in the PyPI wheel
(0.4.1, the newest there, ships only ``inprocess/attribution.py``), so it is not run.

     flock /tmp/ranksight-cpu.lock python bench/import.py --fr [--fr-ranks 16,256,1024,4096]
     [--repeat 3]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time

SRC = os.path.join(os.path.dirname(__file__), "..", "tests", "data", "realdata", "kineto_hta",
                   "nccl_parser_config_nccl_data.json.gz")  # fmt: skip


def _templates(events: list[dict]) -> list[tuple[str, float | None, str]]:
    """Each event as (text before its ts value, ts, text after), ``ProfilerStep#N`` names
    marked ``{step}`` for renumbering."""
    out = []
    for e in events:
        ts = e.get("ts")
        if isinstance(ts, (int, float)):
            e = {**e, "ts": "@TS@"}
        text = json.dumps(e).replace("ProfilerStep#", "ProfilerStep#{step}")
        if isinstance(ts, (int, float)):
            a, b = text.split('"@TS@"', 1)
            out.append((a, ts, b))
        else:
            out.append((text, None, ""))
    return out


def make_trace(path: str, rank: int, mb: float, world: int, top: dict, tpl: list) -> int:
    """Write a ~``mb`` MB trace for ``rank`` from the templates; returns its size (bytes)."""
    tss = [t for _, t, _ in tpl if t is not None]
    span = max(tss) - min(tss)
    head = {**top, "distributedInfo": {**top.get("distributedInfo", {}), "rank": rank,
                                        "world_size": world}}  # fmt: skip
    size, copy, limit = 0, 0, int(mb * (1 << 20))
    with open(path, "w") as out:
        out.write(json.dumps(head)[:-1] + ', "traceEvents": [\n')
        while size < limit:
            shift = copy * (span + 1000.0) + rank * 7.0
            step = f"{copy}0"
            parts = []
            for a, ts, b in tpl:
                if ts is None:
                    parts.append(a)
                else:
                    parts.append(f"{a}{ts + shift:.3f}{b}")
            room = limit - size  # the last copy is cut at an event to end near the size
            if sum(len(x) + 2 for x in parts) > room:
                n, used = 0, 0
                while n < len(parts) and used < room:
                    used += len(parts[n]) + 2
                    n += 1
                parts = parts[: max(n, 1)]
            text = ",\n".join(parts).replace("ProfilerStep#{step}", f"ProfilerStep#{step}")
            out.write(("," if copy else "") + text + "\n")
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

        folder = tempfile.mkdtemp(prefix="bench-import-store-")
        store = open_store(folder)
        store.init_schema()
        r = import_paths(store, paths, ImportConfig(run_id="bench", memory_mb=memory_mb))
        bad = [f.message for f in r.files if not f.ok or "truncated" in f.message]
        if bad or len(r.imported) != len(paths):
            raise SystemExit(f"import failed: {bad}")
        shutil.rmtree(folder, ignore_errors=True)
    print(json.dumps({"peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


def measure(mode: str, paths: list[str], memory_mb: int) -> dict:
    t = time.perf_counter()
    out = subprocess.run([sys.executable, __file__, "--child", mode, "--memory-mb", str(memory_mb), *paths],
                         capture_output=True, text=True)  # fmt: skip
    if out.returncode:
        raise SystemExit(f"{mode} child failed: {out.stderr[-2000:]}")
    mb = sum(os.path.getsize(p) for p in paths) / (1 << 20)
    s = time.perf_counter() - t
    return {**json.loads(out.stdout.strip().splitlines()[-1]), "s": s, "mb": mb}


FR_SRC = os.path.join(os.path.dirname(__file__), "..", "tests", "data", "realdata",
                      "nvrx_fr_dumps", "gpu_error_1st")  # fmt: skip
FR_BLOCK = 16
"""Ranks of the real dumps; a larger set is this many ranks a block."""


def replicate_dump(dump: dict, block: int) -> dict:
    """Rank ``r``'s real dump as rank ``16 * block + r``'s, in torch's own dump layout.

    A process group of all 16 real ranks (``default_pg``, the optimizer's and the expert
    pipeline groups) becomes one group of the whole world (its name kept; its member list
    set by :func:`fr_dumps`); every other group is one block's own: its name and
    ``pg_id`` shifted by ``1000 * block`` (names are creation numbers, unique per group),
    its members by ``16 * block``. Entries (sequence numbers, sizes, states) are the real
    rank's, so every block holds the real fault (ranks 12 and 14 stop completing)."""
    world = {n for n, c in dump["pg_config"].items() if c["ranks"] == str(list(range(FR_BLOCK)))}
    names = {e["pg_id"]: e["process_group"][0] for e in dump["entries"]}

    def name(n: str) -> str:
        return n if n in world or block == 0 else str(int(n) + 1000 * block)

    def pg_id(i):
        return i if names.get(int(i)) in world or block == 0 else type(i)(int(i) + 1000 * block)

    out = {**dump, "pg_config": {}, "pg_status": {}, "entries": []}
    for n, c in dump["pg_config"].items():
        ranks = (
            c["ranks"]
            if n in world
            else str([r + FR_BLOCK * block for r in json.loads(c["ranks"])])
        )
        out["pg_config"][name(n)] = {**c, "name": name(n), "ranks": ranks}
    out["pg_status"] = {pg_id(k): v for k, v in dump["pg_status"].items()}
    for e in dump["entries"]:
        group = (name(e["process_group"][0]), *e["process_group"][1:])
        out["entries"].append({**e, "pg_id": pg_id(e["pg_id"]), "process_group": group})
    return out


def fr_dumps(folder: str, ranks: int) -> str:
    """``folder/r<ranks>/_dump_<rank>`` for ``ranks`` ranks (a multiple of 16); 16: the
    real files copied. Returns the folder of the dumps."""
    import pickle

    out = os.path.join(folder, f"r{ranks}")
    if os.path.isdir(out) and len(os.listdir(out)) == ranks:
        return out
    os.makedirs(out, exist_ok=True)
    real = {}
    for r in range(FR_BLOCK):
        path = os.path.join(FR_SRC, f"_dump_{r}")
        if ranks == FR_BLOCK:
            shutil.copy(path, out)
        with open(path, "rb") as f:
            real[r] = pickle.load(f)  # the repository's own fixture: plain data
    if ranks == FR_BLOCK:
        return out
    everyone = str(list(range(ranks)))
    for b in range(ranks // FR_BLOCK):
        for r, dump in real.items():
            d = replicate_dump(dump, b)
            for c in d["pg_config"].values():
                if c["ranks"] == str(list(range(FR_BLOCK))):
                    c["ranks"] = everyone
            with open(os.path.join(out, f"_dump_{FR_BLOCK * b + r}"), "wb") as f:
                pickle.dump(d, f)
    return out


FR_TOOLS = {
    "ranksight import": lambda d, tmp: ["-m", "ranksight.cli", "import", d],
    "ranksight import --store": lambda d, tmp: ["-m", "ranksight.cli", "import", d, "--store",
                                                tempfile.mkdtemp(prefix="store-", dir=tmp)],
    "fr_trace": lambda d, tmp: ["-m", "torch.distributed.flight_recorder.fr_trace", d, "-p", "_dump_"],
}  # fmt: skip
"""Each tool's command line (after ``python``) on a dump folder; ``--store``: a new one."""


def fr_run(tool: str, folder: str, tmp: str) -> tuple[float, float, int]:
    """(wall s, peak RSS MB, exit code) of one child running ``tool`` on ``folder``."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANKSIGHT_STORE", "RANKSIGHT_HOME")}
    t = time.perf_counter()
    child = subprocess.Popen([sys.executable, *FR_TOOLS[tool](folder, tmp)], cwd=tmp, env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    return time.perf_counter() - t, usage.ru_maxrss / 1024, child.returncode


def fr_main(sizes: list[int], repeat: int) -> None:
    """The ``--fr`` comparison: prints one table row per tool and size."""
    import statistics

    tmp = tempfile.mkdtemp(prefix="bench-fr-", dir="/tmp")
    try:
        folders = {n: fr_dumps(tmp, n) for n in sizes}
        runs: dict[tuple[str, int], list] = {}
        loads = [os.getloadavg()[0]]
        for _ in range(repeat):
            for n in sizes:
                for tool in FR_TOOLS:
                    runs.setdefault((tool, n), []).append(fr_run(tool, folders[n], tmp))
            loads.append(os.getloadavg()[0])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"machine: {platform.node()}, {os.cpu_count()} cores, Python {platform.python_version()}; "
          f"1-min load average {min(loads):.1f}-{max(loads):.1f} during the run; {repeat} runs each")  # fmt: skip
    print(
        "| ranks | tool | wall s median (min-max) | peak RSS MB | exit codes | median / fr_trace |"
    )
    print("|---|---|---|---|---|---|")
    for n in sizes:
        ref = statistics.median(r[0] for r in runs[("fr_trace", n)])
        for tool in FR_TOOLS:
            walls = [r[0] for r in runs[(tool, n)]]
            rss = max(r[1] for r in runs[(tool, n)])
            codes = sorted({r[2] for r in runs[(tool, n)]})
            med = statistics.median(walls)
            print(f"| {n:,} | {tool} | {med:.2f} ({min(walls):.2f}-{max(walls):.2f}) | {rss:.0f} | "
                  f"{','.join(map(str, codes))} | {med / ref:.2f} |")  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--mb", type=float, default=200)
    p.add_argument("--memory-mb", default="64,256", help="budgets, MiB, comma-separated")
    p.add_argument("--keep", default=None, help="folder to keep (and reuse) the traces in")
    p.add_argument("--child", default=None)
    p.add_argument("--fr", action="store_true", help="Flight Recorder dumps against fr_trace")
    p.add_argument("--fr-ranks", default="16,256,1024,4096", help="ranks, multiples of 16")
    p.add_argument("--repeat", type=int, default=3, help="runs of each tool and size (--fr)")
    p.add_argument("paths", nargs="*")
    a = p.parse_args()
    if a.fr:
        return fr_main([int(x) for x in a.fr_ranks.split(",")], a.repeat)
    if a.child:
        return child(a.child, a.paths, int(a.memory_mb))
    budgets = [int(x) for x in a.memory_mb.split(",")]
    tmp = a.keep or tempfile.mkdtemp(prefix="bench-kineto-", dir="/tmp")
    os.makedirs(tmp, exist_ok=True)
    with gzip.open(SRC, "rt") as f:
        top = json.load(f)
    tpl = _templates(top.pop("traceEvents"))
    t = time.perf_counter()
    paths = []
    for r in range(a.ranks):
        path = os.path.join(tmp, f"trace_rank{r}.json")
        if not os.path.exists(path) or abs(os.path.getsize(path) / (1 << 20) - a.mb) > 5:
            make_trace(path, r, a.mb, a.ranks, top, tpl)
        paths.append(path)
    tiny = os.path.join(tmp, "tiny", "trace_rank0.json")
    os.makedirs(os.path.dirname(tiny), exist_ok=True)
    make_trace(tiny, 0, 1, 1, top, tpl)
    print(f"traces ready in {time.perf_counter() - t:.0f} s ({tmp})")
    try:
        rows = [("base: import of one 1 MB trace", measure("import", [tiny], budgets[0]), 0)]
        for b in budgets:
            rows.append(
                (f"import {a.ranks} traces, --memory-mb {b}", measure("import", paths, b), b)
            )
        rows.append((f"import 2 traces, --memory-mb {budgets[0]}", measure("import", paths[:2], budgets[0]), budgets[0]))  # fmt: skip
        rows.append(("json.load of one trace", measure("json", paths[:1], budgets[0]), 0))
    finally:
        if not a.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    base = rows[0][1]["peak_rss_mb"]
    print(f"machine: {platform.node()}, {os.cpu_count()} cores, {platform.processor() or platform.machine()}, "
          f"Python {platform.python_version()}")  # fmt: skip
    print(
        f"{a.ranks} traces of {rows[1][1]['mb'] / a.ranks:.0f} MB ({rows[1][1]['mb']:.0f} MB in all)"
    )
    print("| what | input MB | time s | MB/s | peak RSS MB | peak - base MB | budget MB |")
    print("|---|---|---|---|---|---|---|")
    for name, m, b in rows:
        over = m["peak_rss_mb"] - base
        print(f"| {name} | {m['mb']:.0f} | {m['s']:.1f} | {m['mb'] / m['s']:.1f} | {m['peak_rss_mb']:.0f} | "
              f"{over:.0f} | {b or '-'} |")  # fmt: skip
    for name, m, b in rows[1:-1]:
        ok = m["peak_rss_mb"] - base <= b
        print(f"{name}: peak - base = {m['peak_rss_mb'] - base:.0f} MB "
              f"{'within' if ok else 'OVER'} the {b} MB budget")  # fmt: skip


if __name__ == "__main__":
    main()
