"""Build ``h200x2.json.gz`` (a :class:`ReplayNvml` recording) from the rows the NVML
collector wrote on the GPU machine (``h200x2_rows.json.gz``).

    python tests/data/nvml/build_recording.py

The session's raw-answer recorder did not run there (see README.md), so the answers are
rebuilt from the collector's own rows: each NVML call gets the value the collector turned
into that row (mW from W, KiB from bytes, the clock-event mask, ...) as the real pynvml
types (ctypes structures, field-value arrays), and every field the row left empty gets
``NVML_ERROR_NOT_SUPPORTED``. The collector is then run through :class:`RecordingNvml`
over these answers and its rows must equal the GPU machine's rows exactly (rates from the
second sample on; cumulative PCIe byte counters are rebuilt from the rates, starting at 0).
"""

from __future__ import annotations

import ctypes
import gzip
import json
import os
import sys

import pynvml as P

from ranksight.collectors.base import NodeContext, frame
from ranksight.collectors.nvml import NvmlCollector, NvmlConfig
from ranksight.collectors.nvml_events import XidCollector
from ranksight.collectors.nvml_replay import RecordingNvml

HERE = os.path.dirname(os.path.abspath(__file__))
ROWS = os.path.join(HERE, "h200x2_rows.json.gz")
OUT = os.path.join(HERE, "h200x2.json.gz")
RATES = ("pcie_tx_bytes_s", "pcie_rx_bytes_s", "nvlink_tx_bytes_s", "nvlink_rx_bytes_s")
NAME = "NVIDIA H200"  # nvidia-smi -q: Product Name


def load_rows(path: str = ROWS) -> dict:
    """The GPU machine's rows: ``{"gpu_samples": [...], "gpu_procs": [...]}``."""
    with gzip.open(path, "rt") as f:
        return json.load(f)


class RowAnswers:
    """pynvml answering from one sample's rows at a time (``at(k)``)."""

    def __init__(self, data: dict) -> None:
        self.times = sorted({r["ts_ns"] for r in data["gpu_samples"]})
        self.rows = {(r["ts_ns"], r["gpu_index"]): r for r in data["gpu_samples"]}
        self.procs = data["gpu_procs"]
        self.gpus = sorted({r["gpu_index"] for r in data["gpu_samples"]})
        self.handles = [ctypes.pointer(P.struct_c_nvmlDevice_t()) for _ in self.gpus]
        self.pcie = self._pcie_counts()
        self.k = 0

    def _pcie_counts(self) -> dict:
        """Cumulative PCIe bytes rebuilt from the rates (starting at 0)."""
        out, total = {}, {}
        for k, t in enumerate(self.times):
            for i in self.gpus:
                row = self.rows[(t, i)]
                for d in ("tx", "rx"):
                    rate = row[f"pcie_{d}_bytes_s"]
                    if k and rate is not None:
                        dt = t - self.times[k - 1]
                        total[(i, d)] = total.get((i, d), 0) + round(rate * dt / 1e9)
                    out[(t, i, d)] = total.get((i, d), 0)
        return out

    def at(self, k: int) -> None:
        self.k = k

    def __getattr__(self, name: str):
        return getattr(P, name)

    def _row(self, h) -> dict:
        addr = ctypes.cast(h, ctypes.c_void_p).value
        i = [ctypes.cast(x, ctypes.c_void_p).value for x in self.handles].index(addr)
        return self.rows[(self.times[self.k], i)]

    def _value(self, h, column: str):
        v = self._row(h)[column]
        if v is None:
            raise P.NVMLError(P.NVML_ERROR_NOT_SUPPORTED)
        return v

    def nvmlInit(self) -> None: ...

    def nvmlShutdown(self) -> None: ...

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int):
        return self.handles[i]

    def nvmlDeviceGetPciInfo(self, h):
        info = P.nvmlPciInfo_t()
        domain, rest = self._row(h)["pci_bus_id"].split(":", 1)
        info.busId = f"{int(domain, 16):08X}:{rest.upper()}".encode()
        return info

    def nvmlDeviceGetUUID(self, h) -> str:
        return self._row(h)["gpu_uuid"]

    def nvmlDeviceGetName(self, h) -> str:
        return NAME

    def nvmlDeviceGetMaxClockInfo(self, h, clock: int) -> int:
        return int(
            self._value(h, "sm_clock_max_mhz" if clock == P.NVML_CLOCK_SM else "mem_clock_max_mhz")
        )

    def nvmlDeviceGetClockInfo(self, h, clock: int) -> int:
        return int(self._value(h, "sm_clock_mhz" if clock == P.NVML_CLOCK_SM else "mem_clock_mhz"))

    def nvmlDeviceGetCurrentClocksEventReasons(self, h) -> int:
        return int(self._value(h, "clock_events"))

    def nvmlDeviceGetPowerUsage(self, h) -> int:
        return round(self._value(h, "power_w") * 1000)

    def nvmlDeviceGetEnforcedPowerLimit(self, h) -> int:
        return round(self._value(h, "power_limit_w") * 1000)

    def nvmlDeviceGetTemperature(self, h, sensor: int) -> int:
        return int(self._value(h, "temperature_c"))

    def nvmlDeviceGetUtilizationRates(self, h):
        u = P.c_nvmlUtilization_t()
        u.gpu, u.memory = int(self._value(h, "util_gpu_pct")), int(self._value(h, "util_mem_pct"))
        return u

    def nvmlDeviceGetMemoryInfo(self, h):
        m = P.c_nvmlMemory_t()
        m.total, m.used = (
            int(self._value(h, "mem_total_bytes")),
            int(self._value(h, "mem_used_bytes")),
        )
        m.free = m.total - m.used
        return m

    def nvmlDeviceGetTotalEccErrors(self, h, kind: int, counter: int) -> int:
        col = "ecc_corrected" if kind == P.NVML_MEMORY_ERROR_TYPE_CORRECTED else "ecc_uncorrected"
        return int(self._value(h, col))

    def nvmlDeviceGetRemappedRows(self, h) -> tuple:
        cols = ("remapped_correctable", "remapped_uncorrectable", "remap_pending", "remap_failure")
        return tuple(int(self._value(h, c)) for c in cols)

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h) -> int:
        return int(self._value(h, "pcie_gen"))

    def nvmlDeviceGetCurrPcieLinkWidth(self, h) -> int:
        return int(self._value(h, "pcie_width"))

    def nvmlDeviceGetPcieReplayCounter(self, h) -> int:
        return int(self._value(h, "pcie_replays"))

    def nvmlDeviceGetNvLinkState(self, h, link: int) -> int:
        if link < int(self._value(h, "nvlink_active")):
            return P.NVML_FEATURE_ENABLED
        raise P.NVMLError(P.NVML_ERROR_INVALID_ARGUMENT)

    def nvmlDeviceGetFieldValues(self, h, fields: list):
        row, t = self._row(h), self.times[self.k]
        answers = {
            P.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX: row["nvlink_tx_bytes"],
            P.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX: row["nvlink_rx_bytes"],
            P.NVML_FI_DEV_PCIE_COUNT_TX_BYTES: self.pcie[(t, row["gpu_index"], "tx")],
            P.NVML_FI_DEV_PCIE_COUNT_RX_BYTES: self.pcie[(t, row["gpu_index"], "rx")],
        }
        kib = {P.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, P.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX}
        out = (P.c_nvmlFieldValue_t * len(fields))()
        for n, f in enumerate(fields):
            fid = f[0] if isinstance(f, tuple) else f
            out[n].fieldId = fid
            value = answers.get(fid)
            if value is None:
                out[n].nvmlReturn = P.NVML_ERROR_NOT_SUPPORTED
                continue
            out[n].nvmlReturn, out[n].valueType = 0, P.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
            out[n].value.ullVal = int(value) // 1024 if fid in kib else int(value)
        return out

    def nvmlEventSetCreate(self):
        return P.c_nvmlEventSet_t()

    def nvmlDeviceRegisterEvents(self, h, types: int, event_set) -> None:
        return None  # the GPU machine registered both GPUs (collector_status: xid running)

    def nvmlEventSetWait_v2(self, event_set, timeout_ms: int):
        raise P.NVMLError(P.NVML_ERROR_TIMEOUT)  # no XID came during the session

    def nvmlEventSetFree(self, event_set) -> None:
        return None

    def nvmlDeviceGetComputeRunningProcesses(self, h) -> list:
        row, out = self._row(h), []
        for p in self.procs:
            if p["ts_ns"] == row["ts_ns"] and p["gpu_index"] == row["gpu_index"]:
                info = P.c_nvmlProcessInfo_t()
                info.pid, info.usedGpuMemory = p["pid"], int(p["used_mem_bytes"])
                out.append(info)
        return out


def build(out: str = OUT) -> dict:
    """Write the recording; raises AssertionError if the collector's rows over it differ
    from the GPU machine's."""
    data = load_rows()
    answers = RowAnswers(data)
    rec = RecordingNvml(
        answers, meta={"source": data["source"], "rebuilt_from": os.path.basename(ROWS)}
    )
    ctx = NodeContext(host=data["gpu_samples"][0]["host"])
    xid = XidCollector(ctx, nvml=rec, wait_ms=100)
    xid.open()
    assert xid.collect(answers.times[0]) == {}
    xid.close()
    collector = NvmlCollector(ctx, NvmlConfig(), nvml=rec)
    collector.open()
    rec.data["rows"] = []
    for k, t in enumerate(answers.times):
        if k:
            rec.snapshot()
        answers.at(k)
        rec.data["rows"].append({"now_ns": t, "rows": collector.collect(t)})
    check(rec.data["rows"], data)
    with gzip.open(out, "wt") as f:
        json.dump(rec.data, f, sort_keys=True)
    return rec.data


def check(produced: list[dict], data: dict) -> None:
    """The collector's rows equal the GPU machine's (see the module doc)."""
    got = frame("gpu_samples", [r for snap in produced for r in snap["rows"]["gpu_samples"]])
    want = frame("gpu_samples", data["gpu_samples"])
    first = got.ts_ns == got.ts_ns.min()
    for col in RATES:
        got.loc[first, col] = want.loc[first, col]
        got.loc[first, "unsupported"] = want.loc[first, "unsupported"]
    assert got.equals(want), got.compare(want)
    procs = [r for snap in produced for r in snap["rows"]["gpu_procs"]]
    keep = ("ts_ns", "gpu_index", "pid", "used_mem_bytes")
    assert [{k: r[k] for k in keep} for r in procs] == [
        {k: r[k] for k in keep} for r in data["gpu_procs"]
    ]


if __name__ == "__main__":
    build(sys.argv[1] if len(sys.argv) > 1 else OUT)
    print(f"wrote {OUT}")
