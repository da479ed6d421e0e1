"""GPU health from NVML: clocks and why they dropped, power, temperature, memory, ECC,
remapped rows, PCIe, NVLink, and which rank's process runs on which GPU.

One row per GPU per sample in ``gpu_samples`` (units: MHz, W, °C, %, bytes, bytes/s; a
field the GPU or driver does not report is NaN and named in ``unsupported``), one row per
(GPU, process) every ``procs_every`` samples in ``gpu_procs``, and a ``gpu_lost`` row in
``gpu_events`` when NVML says a GPU fell off the bus (that GPU is not read again). NVML
calls and units are those of the NVML API reference (nvml.h) through ``pynvml``
(nvidia-ml-py).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from .base import Collector, NodeContext, Rows, Unavailable
from .counters import CounterSet
from .local_ranks import LocalRanks
from .nvml_read import GpuLost, SafeReader, clock_event_names, gpu_count, member, number

log = logging.getLogger("ranksight.collectors.nvml")

_ALL_LINKS = 0xFFFFFFFF
"""``scopeId`` asking an NVLink field for the sum over all links (nvml.h: UINT_MAX)."""
_KIB = 1024


@dataclass(kw_only=True, slots=True)
class NvmlConfig:
    """How the GPU collector samples."""

    interval_s: float = 1.0
    """Seconds between samples of every GPU."""
    procs_every: int = 10
    """Read the GPU's processes (``gpu_procs``) every this many samples."""
    links_every: int = 10
    """Re-read NVLink link states every this many samples (they rarely change)."""
    pcie_throughput_fallback: bool = True
    """Where the GPU has no PCIe byte counters, ask ``nvmlDeviceGetPcieThroughput``
    instead (it samples for 20 ms per call, per direction)."""

    def __post_init__(self) -> None:
        if self.interval_s <= 0:
            raise ValueError(f"nvml interval_s must be > 0, got {self.interval_s}")
        if self.procs_every < 1 or self.links_every < 1:
            raise ValueError("nvml procs_every and links_every must be >= 1")


@dataclass(slots=True)
class Gpu:
    """One GPU as the collector knows it."""

    index: int
    handle: Any
    uuid: str
    pci_bus_id: str
    name: str
    sm_clock_max_mhz: float | None = None
    mem_clock_max_mhz: float | None = None
    nvlink_active: int | None = None
    lost: bool = False
    samples: int = field(default=0)


def load_nvml(nvml: Any = None) -> Any:
    """``nvml`` if given, else the ``pynvml`` module, initialized (``nvmlInit``).
    Raises :class:`Unavailable` naming why NVML cannot be used here."""
    if nvml is None:
        try:
            import pynvml
        except ImportError:
            raise Unavailable("pynvml (nvidia-ml-py) is not installed") from None
        nvml = pynvml
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        raise Unavailable(f"NVML is not available on this node: {exc}") from None
    return nvml


def text(value: Any) -> str:
    """An NVML string answer (``str`` or ``bytes``) as text."""
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def pci_bus_id(nvml_bus_id: Any) -> str:
    """NVML's ``00000000:3B:00.0`` as sysfs writes it: ``0000:3b:00.0`` (text that is no
    such address is kept as it is, lower case)."""
    bus = text(nvml_bus_id).lower()
    domain, _, rest = bus.partition(":")
    if not rest or not domain.isascii() or not domain.isalnum():
        return bus
    try:
        return f"{int(domain, 16):04x}:{rest}"
    except ValueError:
        return bus


class NvmlCollector(Collector):
    """Samples every GPU NVML sees; see the module doc for the tables."""

    name = "nvml"
    tables = ("gpu_samples", "gpu_procs", "gpu_events")

    def __init__(
        self,
        ctx: NodeContext,
        config: NvmlConfig | None = None,
        *,
        nvml: Any = None,
        local_ranks: LocalRanks | None = None,
    ) -> None:
        self.ctx = ctx
        self.config = config or NvmlConfig()
        self.interval_s = self.config.interval_s
        self._nvml_arg = nvml
        self.nvml: Any = None
        self.local_ranks = local_ranks or LocalRanks(ctx.spool_dir)
        self.gpus: list[Gpu] = []
        self._lost: list[tuple[int, str]] = []
        """GPUs found lost at :meth:`open` (index, why), reported by the next collect."""
        self._counters = CounterSet()

    def open(self) -> None:
        """Initialize NVML and list the GPUs. Raises :class:`Unavailable` without NVML. A
        GPU lost already is not read; the first :meth:`collect` reports it."""
        self.nvml = load_nvml(self._nvml_arg)
        n = self.nvml
        self.reader = SafeReader(n)
        self.gpus, self._lost = [], []
        for index in range(gpu_count(n)):
            try:
                self.gpus.append(self._open_gpu(index))
            except (GpuLost, n.NVMLError) as exc:
                if isinstance(exc, n.NVMLError) and exc.value != n.NVML_ERROR_GPU_IS_LOST:
                    log.warning("GPU %d is not read: %s", index, exc)
                    continue
                self._lost.append((index, str(exc)))

    def _open_gpu(self, index: int) -> Gpu:
        n, read = self.nvml, self.reader.read
        h = n.nvmlDeviceGetHandleByIndex(index)
        pci = read(index, "pci_bus_id", n.nvmlDeviceGetPciInfo, h)
        gpu = Gpu(
            index=index,
            handle=h,
            uuid=text(read(index, "uuid", n.nvmlDeviceGetUUID, h) or ""),
            pci_bus_id=pci_bus_id(getattr(pci, "busId", "")) if pci is not None else "",
            name=text(read(index, "name", n.nvmlDeviceGetName, h) or ""),
        )
        gpu.sm_clock_max_mhz = read(
            index, "sm_clock_max_mhz", n.nvmlDeviceGetMaxClockInfo, h, n.NVML_CLOCK_SM
        )
        gpu.mem_clock_max_mhz = read(
            index, "mem_clock_max_mhz", n.nvmlDeviceGetMaxClockInfo, h, n.NVML_CLOCK_MEM
        )
        return gpu

    def close(self) -> None:
        """Shut NVML down (once)."""
        if self.nvml is not None:
            try:
                self.nvml.nvmlShutdown()
            except self.nvml.NVMLError:
                pass
            self.nvml = None

    def collect(self, now_ns: int) -> Rows:
        """One ``gpu_samples`` row per GPU not lost; ``gpu_procs`` every ``procs_every``
        samples; a ``gpu_events`` row for a GPU found lost now."""
        rows: Rows = {"gpu_samples": [], "gpu_procs": [], "gpu_events": []}
        for index, why in self._lost:
            rows["gpu_events"].append(self._lost_row(now_ns, index, "", why))
        self._lost = []
        for gpu in self.gpus:
            if gpu.lost:
                continue
            try:
                rows["gpu_samples"].append(self._sample(gpu, now_ns))
                if gpu.samples % self.config.procs_every == 0:
                    rows["gpu_procs"].extend(self._procs(gpu, now_ns))
            except GpuLost as exc:
                gpu.lost = True
                rows["gpu_events"].append(self._lost_row(now_ns, gpu.index, gpu.uuid, str(exc)))
            gpu.samples += 1
        return rows

    def _lost_row(self, now_ns: int, index: int, uuid: str, why: str) -> dict:
        """The ``gpu_events`` row of GPU ``index`` found lost."""
        event = {"gpu_index": index, "gpu_uuid": uuid, "kind": "gpu_lost", "detail": why}
        return {**self._node(now_ns), **event, "code": self.nvml.NVML_ERROR_GPU_IS_LOST}

    def _node(self, now_ns: int) -> dict:
        return {"host": self.ctx.host, "ts_ns": now_ns}

    def _sample(self, gpu: Gpu, now_ns: int) -> dict:
        """One ``gpu_samples`` row."""
        row = {
            **self._node(now_ns),
            "gpu_index": gpu.index,
            "gpu_uuid": gpu.uuid,
            "pci_bus_id": gpu.pci_bus_id,
            "sm_clock_max_mhz": gpu.sm_clock_max_mhz,
            "mem_clock_max_mhz": gpu.mem_clock_max_mhz,
        }
        for part in (self._clocks, self._power, self._memory, self._pcie, self._nvlink):
            row.update(part(gpu, now_ns))
        row["unsupported"] = ",".join(sorted(_empty(row, first=gpu.samples == 0)))
        return row

    def _clocks(self, gpu: Gpu, now_ns: int) -> dict:
        n, i, h, read = self.nvml, gpu.index, gpu.handle, self.reader.read
        reasons_fn = (
            getattr(n, "nvmlDeviceGetCurrentClocksEventReasons", None)
            or n.nvmlDeviceGetCurrentClocksThrottleReasons
        )
        mask = read(i, "clock_events", reasons_fn, h)
        mask = mask if type(mask) is int and mask >= 0 else None
        return {
            "sm_clock_mhz": read(i, "sm_clock_mhz", n.nvmlDeviceGetClockInfo, h, n.NVML_CLOCK_SM),
            "mem_clock_mhz": read(
                i, "mem_clock_mhz", n.nvmlDeviceGetClockInfo, h, n.NVML_CLOCK_MEM
            ),
            "clock_events": -1 if mask is None else mask,
            "clock_event_names": "" if mask is None else clock_event_names(mask),
        }

    def _power(self, gpu: Gpu, now_ns: int) -> dict:
        n, i, h, read = self.nvml, gpu.index, gpu.handle, self.reader.read
        power = number(read(i, "power_w", n.nvmlDeviceGetPowerUsage, h))  # mW
        limit = number(read(i, "power_limit_w", n.nvmlDeviceGetEnforcedPowerLimit, h))  # mW
        util = read(i, "util_gpu_pct", n.nvmlDeviceGetUtilizationRates, h)
        return {
            "power_w": None if power is None else power / 1000,
            "power_limit_w": None if limit is None else limit / 1000,
            "temperature_c": read(
                i, "temperature_c", n.nvmlDeviceGetTemperature, h, n.NVML_TEMPERATURE_GPU
            ),
            "util_gpu_pct": None if util is None else member(util, "gpu"),
            "util_mem_pct": None if util is None else member(util, "memory"),
        }

    def _memory(self, gpu: Gpu, now_ns: int) -> dict:
        n, i, h, read = self.nvml, gpu.index, gpu.handle, self.reader.read
        mem = read(i, "mem_used_bytes", n.nvmlDeviceGetMemoryInfo, h)
        ecc = n.nvmlDeviceGetTotalEccErrors
        remap = read(i, "remapped_rows", n.nvmlDeviceGetRemappedRows, h)
        remap = remap if isinstance(remap, (list, tuple)) and len(remap) == 4 else (None,) * 4
        corr, unc, pending, failure = (number(v) for v in remap)
        return {
            "mem_used_bytes": None if mem is None else member(mem, "used"),
            "mem_total_bytes": None if mem is None else member(mem, "total"),
            "ecc_corrected": read(
                i, "ecc_corrected", ecc, h, n.NVML_MEMORY_ERROR_TYPE_CORRECTED, n.NVML_VOLATILE_ECC
            ),
            "ecc_uncorrected": read(
                i,
                "ecc_uncorrected",
                ecc,
                h,
                n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                n.NVML_VOLATILE_ECC,
            ),
            "remapped_correctable": corr,
            "remapped_uncorrectable": unc,
            "remap_pending": pending,
            "remap_failure": failure,
        }

    def _pcie(self, gpu: Gpu, now_ns: int) -> dict:
        n, i, h, read = self.nvml, gpu.index, gpu.handle, self.reader.read
        counts = self.reader.fields(i, h, _pcie_fields(n))
        tx, rx = (self._rate(gpu, k, counts.get(k), now_ns) for k in ("pcie_tx", "pcie_rx"))
        if counts.get("pcie_tx") is None and self.config.pcie_throughput_fallback:
            kb_tx = read(
                i, "pcie_tx_bytes_s", n.nvmlDeviceGetPcieThroughput, h, n.NVML_PCIE_UTIL_TX_BYTES
            )
            kb_rx = read(
                i, "pcie_rx_bytes_s", n.nvmlDeviceGetPcieThroughput, h, n.NVML_PCIE_UTIL_RX_BYTES
            )
            tx = None if number(kb_tx) is None else kb_tx * _KIB  # KB/s (nvml.h)
            rx = None if number(kb_rx) is None else kb_rx * _KIB
        return {
            "pcie_gen": read(i, "pcie_gen", n.nvmlDeviceGetCurrPcieLinkGeneration, h),
            "pcie_width": read(i, "pcie_width", n.nvmlDeviceGetCurrPcieLinkWidth, h),
            "pcie_tx_bytes_s": tx,
            "pcie_rx_bytes_s": rx,
            "pcie_replays": read(i, "pcie_replays", n.nvmlDeviceGetPcieReplayCounter, h),
        }

    def _nvlink(self, gpu: Gpu, now_ns: int) -> dict:
        if gpu.samples % self.config.links_every == 0:
            gpu.nvlink_active = self._links_up(gpu)
        f = self.reader.fields(gpu.index, gpu.handle, _nvlink_fields(self.nvml))
        tx = None if f["nvlink_tx"] is None else f["nvlink_tx"] * _KIB  # KiB (nvml.h)
        rx = None if f["nvlink_rx"] is None else f["nvlink_rx"] * _KIB
        crc = (
            None
            if f["crc_flit"] is None and f["crc_data"] is None
            else (f["crc_flit"] or 0) + (f["crc_data"] or 0)
        )
        return {
            "nvlink_active": gpu.nvlink_active,
            "nvlink_tx_bytes": tx,
            "nvlink_rx_bytes": rx,
            "nvlink_tx_bytes_s": self._rate(gpu, "nvlink_tx", tx, now_ns),
            "nvlink_rx_bytes_s": self._rate(gpu, "nvlink_rx", rx, now_ns),
            "nvlink_crc_errors": crc,
            "nvlink_replay_errors": f["replay"],
            "nvlink_recovery_errors": f["recovery"],
        }

    def _links_up(self, gpu: Gpu) -> int | None:
        """Links in state enabled, or None if the GPU reports no link state."""
        n, states = self.nvml, []
        for link in range(n.NVML_NVLINK_MAX_LINKS):
            state = self.reader.read(
                gpu.index, f"_nvlink{link}", n.nvmlDeviceGetNvLinkState, gpu.handle, link
            )
            if state is not None:
                states.append(state)
        return sum(1 for s in states if s == n.NVML_FEATURE_ENABLED) if states else None

    def _rate(self, gpu: Gpu, key: str, value: float | None, now_ns: int) -> float | None:
        """Bytes/s of cumulative counter ``key``; None without a value or a previous one."""
        if value is None or not 0 <= value < 1 << 64:  # the fields give finite numbers
            return None
        rate = self._counters.update((gpu.index, key), int(value), now_ns).rate_per_s
        return None if rate != rate else rate

    def _procs(self, gpu: Gpu, now_ns: int) -> list[dict]:
        """``gpu_procs`` rows for the compute processes on ``gpu``."""
        n = self.nvml
        procs = self.reader.read(
            gpu.index, "processes", n.nvmlDeviceGetComputeRunningProcesses, gpu.handle
        )
        ranks = self.local_ranks.by_pid()
        rows = []
        for p in procs if isinstance(procs, list) else ():
            pid = member(p, "pid")
            if type(pid) is not int or not 0 < pid < 1 << 32:
                continue
            lr = ranks.get(pid)
            rows.append(
                {
                    **self._node(now_ns),
                    "gpu_index": gpu.index,
                    "gpu_uuid": gpu.uuid,
                    "pid": pid,
                    "used_mem_bytes": member(p, "usedGpuMemory"),
                    "run_id": lr.run_id if lr else "",
                    "attempt": lr.attempt if lr else 0,
                    "rank": lr.rank if lr else -1,
                }
            )
        return rows


def _pcie_fields(n: Any) -> dict[str, Any]:
    """Cumulative PCIe byte counters (field ids 197/198, newer drivers)."""
    ids = {
        "pcie_tx": "NVML_FI_DEV_PCIE_COUNT_TX_BYTES",
        "pcie_rx": "NVML_FI_DEV_PCIE_COUNT_RX_BYTES",
    }
    return {k: getattr(n, v) for k, v in ids.items() if hasattr(n, v)}


def _empty(row: dict, first: bool) -> list[str]:
    """Columns of a sample with no value; a rate's first sample has none by nature."""
    return [k for k, v in row.items() if v is None and not (first and k.endswith("_bytes_s"))]


def _nvlink_fields(n: Any) -> dict[str, Any]:
    """NVLink throughput (KiB, all links) and error totals, by our names."""
    return {
        "nvlink_tx": (n.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, _ALL_LINKS),
        "nvlink_rx": (n.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, _ALL_LINKS),
        "crc_flit": n.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL,
        "crc_data": n.NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL,
        "replay": n.NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL,
        "recovery": n.NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL,
    }
