"""XID errors as events: an NVML event set waited on in the collector's own thread.

An XID is the driver's error report for a GPU (e.g. 79: fallen off the bus, 48: double-bit
ECC, 63/64: row remapping; NVIDIA's "XID Errors" guide lists them). NVML delivers them
through ``nvmlEventSetWait`` on a set registered with ``nvmlEventTypeXidCriticalError``;
each becomes a ``gpu_events`` row (kind ``xid``, code = the XID number).
"""

from __future__ import annotations

import time
from typing import Any

from .base import Collector, NodeContext, Rows, Unavailable
from .nvml import load_nvml, text
from .nvml_read import gpu_count


class XidCollector(Collector):
    """Waits up to ``wait_ms`` per call for an XID event on any GPU (``interval_s`` 0: the
    runner calls :meth:`collect` back to back; the wait is the pacing)."""

    name = "xid"
    tables = ("gpu_events",)
    interval_s = 0.0

    def __init__(self, ctx: NodeContext, *, nvml: Any = None, wait_ms: int = 1000) -> None:
        if wait_ms < 1:
            raise ValueError(f"xid wait_ms must be >= 1, got {wait_ms}")
        self.ctx = ctx
        self.wait_ms = wait_ms
        self._nvml_arg = nvml
        self.nvml: Any = None
        self._set: Any = None
        self._index_by_uuid: dict[str, int] = {}

    def open(self) -> None:
        """Register every GPU for XID events. Raises :class:`Unavailable` without NVML or
        when no GPU can be registered (not supported by the driver or the GPU)."""
        self.nvml = n = load_nvml(self._nvml_arg)
        self._set = n.nvmlEventSetCreate()
        refused = []
        try:
            count = gpu_count(n)
        except Unavailable:
            self.close()
            raise
        for index in range(count):
            h = n.nvmlDeviceGetHandleByIndex(index)
            try:
                n.nvmlDeviceRegisterEvents(h, n.nvmlEventTypeXidCriticalError, self._set)
                self._index_by_uuid[text(n.nvmlDeviceGetUUID(h))] = index
            except n.NVMLError as exc:
                refused.append(f"GPU {index}: {exc}")
        if not self._index_by_uuid:
            self.close()
            raise Unavailable(
                "XID events cannot be registered: " + ("; ".join(refused) or "no GPUs")
            )

    def collect(self, now_ns: int) -> Rows:
        """At most one ``gpu_events`` row: the next XID within ``wait_ms``."""
        n = self.nvml
        try:
            data = n.nvmlEventSetWait_v2(self._set, self.wait_ms)
        except n.NVMLError as exc:
            if exc.value == n.NVML_ERROR_TIMEOUT:
                return {}
            raise
        try:
            uuid = text(n.nvmlDeviceGetUUID(getattr(data, "device", None)))
        except n.NVMLError:  # no handle of a GPU: the event stands, its GPU unknown
            uuid = ""
        kind = getattr(data, "eventType", None)
        row = {
            "host": self.ctx.host,
            "ts_ns": time.time_ns(),  # when it arrived, not when the wait began
            "gpu_index": self._index_by_uuid.get(uuid, -1),
            "gpu_uuid": uuid,
            "kind": "xid",
            "code": getattr(data, "eventData", -1),  # fitted to Int64 (base.fitted)
            "detail": f"event type {kind:#x}" if type(kind) is int else f"event type {kind!r:.40}",
        }
        return {"gpu_events": [row]}

    def close(self) -> None:
        """Free the event set and shut NVML down (once)."""
        if self.nvml is None:
            return
        try:
            if self._set is not None:
                self.nvml.nvmlEventSetFree(self._set)
            self.nvml.nvmlShutdown()
        except self.nvml.NVMLError:
            pass
        self.nvml, self._set = None, None
