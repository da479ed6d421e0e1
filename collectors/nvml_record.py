"""Record a GPU machine's real NVML answers for :class:`~ranksight.collectors.nvml_replay.ReplayNvml`.

Run on a machine with GPUs::

    python -m ranksight.collectors.nvml_record OUT.json --snapshots 8 --every 5

It runs the real :class:`~ranksight.collectors.nvml.NvmlCollector` (and the XID
collector's registration and one wait) through :class:`RecordingNvml`, so the recording
holds exactly the calls the collector makes, plus probes of every field id and scope the
collector might use, and the rows the collector produced from them (``rows``, with the
sample times), so a replay can be checked against what the collector saw on the GPU.
"""

from __future__ import annotations

import argparse
import datetime
import socket
import time
from typing import Any

from .base import NodeContext, Unavailable
from .nvml import NvmlCollector, NvmlConfig
from .nvml_events import XidCollector
from .nvml_replay import RecordingNvml

PROBE_FIELDS = (
    38, 45, 52, 59,  # NVLink CRC flit / CRC data / replay / recovery totals
    138, 139, 140, 141,  # NVLink throughput data/raw TX/RX (KiB)
    142, 143, 144, 145,  # remapped rows
    94, 95, 197, 198,  # PCIe replay (and rollover), PCIe TX/RX byte counters
)  # fmt: skip
"""Field ids asked once with no scope, scope 0 and scope UINT_MAX (nvml.h ``NVML_FI_*``)."""


def probe(rec: RecordingNvml, collector: NvmlCollector) -> None:
    """Ask every probe field with each scope, and the calls only a fallback makes."""
    n = rec
    for gpu in collector.gpus:
        for fid in PROBE_FIELDS:
            for field in (fid, (fid, 0), (fid, 0xFFFFFFFF)):
                try:
                    n.nvmlDeviceGetFieldValues(gpu.handle, [field])
                except n.NVMLError:
                    pass
        for fn, args in (
            (n.nvmlDeviceGetPcieThroughput, (n.NVML_PCIE_UTIL_TX_BYTES,)),
            (n.nvmlDeviceGetPcieThroughput, (n.NVML_PCIE_UTIL_RX_BYTES,)),
            (n.nvmlDeviceGetCurrentClocksThrottleReasons, ()),
            (n.nvmlDeviceGetComputeRunningProcesses, ()),
        ):
            try:
                fn(gpu.handle, *args)
            except n.NVMLError:
                pass


def record_events(rec: RecordingNvml, ctx: NodeContext) -> str:
    """Register for XID events and wait once (100 ms); returns what happened."""
    xid = XidCollector(ctx, nvml=rec, wait_ms=100)
    try:
        xid.open()
    except Unavailable as exc:
        return f"unavailable: {exc}"
    try:
        return f"registered; one wait gave {xid.collect(time.time_ns())}"
    finally:
        xid.close()


def record(out: str, snapshots: int, every_s: float, spool_dir: str = "") -> dict[str, Any]:
    """Record ``snapshots`` collector samples ``every_s`` apart into ``out`` (``spool_dir``:
    the local ranks' spool, so ``gpu_procs`` rows name their ranks)."""
    import pynvml

    started = datetime.datetime.now(datetime.timezone.utc)
    meta: dict[str, Any] = {"host": socket.gethostname(), "recorded": started.isoformat()}
    rec = RecordingNvml(pynvml, meta=meta)
    ctx = NodeContext(host=meta["host"], spool_dir=spool_dir)
    collector = NvmlCollector(ctx, NvmlConfig(procs_every=1), nvml=rec)
    collector.open()
    meta["driver"] = pynvml.nvmlSystemGetDriverVersion()
    meta["gpus"] = [g.name for g in collector.gpus]
    probe(rec, collector)
    meta["xid"] = record_events(rec, ctx)
    rec.data["rows"] = []
    for k in range(snapshots):
        if k:
            time.sleep(every_s)
            rec.snapshot()
        now_ns = time.time_ns()
        rec.data["rows"].append({"now_ns": now_ns, "rows": collector.collect(now_ns)})
    collector.close()
    rec.save(out)
    return meta


def main(argv: list[str] | None = None) -> None:
    """Command-line entry point."""
    p = argparse.ArgumentParser(prog="python -m ranksight.collectors.nvml_record")
    p.add_argument("out", help="JSON file to write")
    p.add_argument("--snapshots", type=int, default=3)
    p.add_argument("--every", type=float, default=1.0, help="seconds between snapshots")
    p.add_argument("--spool", default="", help="the local ranks' spool folder")
    a = p.parse_args(argv)
    print(record(a.out, a.snapshots, a.every, a.spool))


if __name__ == "__main__":
    main()
