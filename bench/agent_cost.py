"""What the node agent's collectors cost: CPU (% of one core) and memory (RSS) per node.

Runs every collector at its default interval inside this process, writing to a store,
and measures this process's CPU time over the same wall-clock window twice: collectors
stopped (the baseline: an idle agent process) and running. Prints both and the
difference, plus the RSS, and the rows written per table.

    python bench/agent_cost.py --seconds 60                      # this node's real signals
    python bench/agent_cost.py --seconds 60 --replay-gpus 8      # + 8 replayed GPUs

``--replay-gpus N`` answers NVML from the recording in tests/data/nvml/ widened to N GPUs
(the cost of the collector's own Python work; a real driver adds its call time: measure
that on a GPU machine, where NVML is real). The target is under 2% of one core and
200 MB for a node of 8 GPUs.
"""

from __future__ import annotations

import argparse
import copy
import gzip
import json
import os
import sys
import tempfile
import time

import psutil

HERE = os.path.dirname(os.path.abspath(__file__))
RECORDING = os.path.join(HERE, "..", "tests", "data", "nvml", "h200x2.json.gz")


def widen(recording: dict, gpus: int) -> dict:
    """``recording`` with its GPUs repeated to make ``gpus`` of them (for cost only)."""
    out = copy.deepcopy(recording)
    for snap in out["snapshots"]:
        devices = snap["devices"]
        snap["devices"] = [copy.deepcopy(devices[i % len(devices)]) for i in range(gpus)]
    out["system"]["nvmlDeviceGetCount()"] = {"value": gpus}
    for i in range(gpus):
        out["system"][f"nvmlDeviceGetHandleByIndex({i})"] = {"value": f"gpu{i}"}
    return out


def collectors(config, replay_gpus: int):
    """The default collectors; NVML and XID answer from a replay when asked."""
    from ranksight.agent.collect import build
    from ranksight.collectors.base import NodeContext
    from ranksight.collectors.nvml import NvmlCollector
    from ranksight.collectors.nvml_events import XidCollector
    from ranksight.collectors.nvml_replay import ReplayNvml

    built = build(config)
    if not replay_gpus:
        return built
    with gzip.open(RECORDING, "rt") as f:
        rec = widen(json.load(f), replay_gpus)
    ctx = NodeContext(host=config.host, spool_dir=config.spool_dir, data_dir=config.data_dir)
    swap = {
        "nvml": NvmlCollector(ctx, nvml=ReplayNvml(rec)),
        "xid": XidCollector(ctx, nvml=ReplayNvml(rec)),
    }
    return [swap.get(c.name, c) for c in built]


def cpu_window(seconds: float) -> float:
    """This process's CPU use over the next ``seconds``, in % of one core."""
    proc = psutil.Process()
    t0, c0 = time.monotonic(), sum(proc.cpu_times()[:2])
    time.sleep(seconds)
    return 100 * (sum(proc.cpu_times()[:2]) - c0) / (time.monotonic() - t0)


def measure(store, config, seconds: float, replay_gpus: int = 0, settle_s: float = 3.0) -> dict:
    """Baseline and collector CPU % of one core, RSS (MB), states and rows inserted."""
    from ranksight.agent.collect import Collection

    idle = cpu_window(seconds)
    rss0 = psutil.Process().memory_info().rss / 2**20
    collection = Collection(store, config, collectors(config, replay_gpus))
    collection.start()
    time.sleep(settle_s)  # imports, NVML init, first samples
    busy = cpu_window(seconds)
    rss = psutil.Process().memory_info().rss / 2**20
    collection.stop()
    return {
        "idle_cpu_pct": idle,
        "collectors_cpu_pct": busy,
        "rss_mb": rss,
        "rss_before_mb": rss0,
        "heavy_imports": [m for m in ("torch", "chdb", "pandas", "pyarrow") if m in sys.modules],
        "states": dict(collection.state),
        "errors": dict(collection.errors),
        "rows_inserted": collection.sink.inserted,
    }


def report(result: dict, label: str) -> None:
    """Print one measurement."""
    print(f"== agent cost: {label}")
    print(f"   idle agent process    : {result['idle_cpu_pct']:6.2f} % of one core")
    print(f"   with all collectors   : {result['collectors_cpu_pct']:6.2f} % of one core")
    print(
        f"   collectors alone      : {result['collectors_cpu_pct'] - result['idle_cpu_pct']:6.2f} % of one core"
    )
    print(f"   RSS                   : {result['rss_mb']:6.1f} MB "
          f"({result['rss_before_mb']:.1f} MB before the collectors started; "
          f"process imports {', '.join(result['heavy_imports'])})")  # fmt: skip
    print(f"   collectors            : {result['states']}  errors {result['errors']}")
    print(f"   rows inserted         : {result['rows_inserted']}")


def main(argv: list[str] | None = None) -> None:
    """Command-line entry point."""
    p = argparse.ArgumentParser(prog="python bench/agent_cost.py")
    p.add_argument("--seconds", type=float, default=60.0, help="length of each window")
    p.add_argument(
        "--replay-gpus", type=int, default=0, help="answer NVML from the recording, N GPUs"
    )
    p.add_argument("--store", default=None, help="store URL (default: a fresh chdb folder)")
    p.add_argument("--spool", default="", help="the local ranks' spool folder")
    a = p.parse_args(argv)
    from ranksight.agent.collect import CollectConfig
    from ranksight.store import open_store

    tmp = tempfile.mkdtemp(prefix="agent-cost-")
    store = open_store(a.store or os.path.join(tmp, "store"))
    store.init_schema()
    config = CollectConfig(spool_dir=a.spool or os.path.join(tmp, "spool"), data_dir=tmp)
    label = f"{a.seconds:g} s windows, {os.cpu_count()} cores, python {sys.version.split()[0]}"
    if a.replay_gpus:
        label += f", {a.replay_gpus} replayed GPUs"
    report(measure(store, config, a.seconds, a.replay_gpus), label)


if __name__ == "__main__":
    main()
