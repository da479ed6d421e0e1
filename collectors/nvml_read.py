"""Read NVML fields so that a field a GPU or driver does not report is empty, never a crash.

After gpustat (wookayin/gpustat): every read is wrapped; "not supported" answers make the
field empty (``None``) and are remembered, so the call is not repeated every sample; a
lost GPU raises :class:`GpuLost` for the collector to report once; any other NVML error
leaves the field empty for this sample and is logged once per field and error.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

from .base import Unavailable

log = logging.getLogger("ranksight.collectors.nvml")

NOT_REPORTED = (
    "NVML_ERROR_NOT_SUPPORTED",
    "NVML_ERROR_FUNCTION_NOT_FOUND",
    "NVML_ERROR_NO_PERMISSION",
    "NVML_ERROR_NOT_FOUND",
    "NVML_ERROR_INVALID_ARGUMENT",
)
"""NVML return codes meaning "this GPU, driver or user does not get this field" (nvml.h)."""

CLOCK_EVENT_NAMES = (
    (0x1, "gpu_idle"),
    (0x2, "applications_clocks_setting"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal_slowdown"),
    (0x40, "hw_thermal_slowdown"),
    (0x80, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
    (0x200, "board_limit"),
    (0x400, "reliability"),
)
"""Clock-event (throttle) reason bits, from nvml.h's ``nvmlClocksEventReason*`` and the
older ``nvmlClocksThrottleReason*`` constants (the last two exist only in the latter)."""

_VALUE_MEMBER = {
    0: "dVal",
    1: "uiVal",
    2: "ulVal",
    3: "ullVal",
    4: "sllVal",
    5: "siVal",
    6: "usVal",
}


def number(value: Any) -> float | int | None:
    """``value`` if it is a finite number (an int or float, not a bool), else None: what
    NVML (or a recording of it) answered where a number belongs and gave none."""
    if type(value) is int or (type(value) is float and math.isfinite(value)):
        return value
    return None


def member(obj: Any, name: str) -> float | int | None:
    """The :func:`number` in attribute ``name`` of an NVML structure, None if absent."""
    return number(getattr(obj, name, None))


def gpu_count(nvml: Any) -> int:
    """``nvmlDeviceGetCount()``; raises :class:`~ranksight.collectors.base.Unavailable`
    if the answer is no count (NVML errors propagate)."""
    count = nvml.nvmlDeviceGetCount()
    if type(count) is not int or not 0 <= count < 1 << 16:
        raise Unavailable(f"NVML answered {count!r:.40} for the number of GPUs")
    return count


class GpuLost(RuntimeError):
    """NVML answered ``NVML_ERROR_GPU_IS_LOST`` (the GPU fell off the bus)."""


def clock_event_names(mask: int) -> str:
    """The set bits of a clock-event reason ``mask`` as comma-separated names; unknown
    bits as ``bit0x...``. Example: ``0x44`` -> ``"sw_power_cap,hw_thermal_slowdown"``."""
    names, known = [], 0
    for bit, name in CLOCK_EVENT_NAMES:
        known |= bit
        if mask & bit:
            names.append(name)
    rest = mask & ~known
    if rest:
        names.append(f"bit{rest:#x}")
    return ",".join(names)


class SafeReader:
    """Wraps NVML calls of one ``nvml`` module (``pynvml`` or a replay)."""

    def __init__(self, nvml: Any) -> None:
        self.nvml = nvml
        self._not_reported_codes = {getattr(nvml, c) for c in NOT_REPORTED if hasattr(nvml, c)}
        self._lost = nvml.NVML_ERROR_GPU_IS_LOST
        self.not_reported: dict[int, set[str]] = {}
        """Fields each GPU (by index) does not report."""
        self._logged: set[tuple[str, int]] = set()

    def read(self, index: int, field: str, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)``, or None if GPU ``index`` does not report ``field`` or the call
        failed. Raises :class:`GpuLost` if NVML says the GPU is lost."""
        skip = self.not_reported.setdefault(index, set())
        if field in skip:
            return None
        try:
            return fn(*args)
        except self.nvml.NVMLError as exc:
            code = exc.value
            if code == self._lost:
                raise GpuLost(f"GPU {index}: {exc}") from None
            if code in self._not_reported_codes:
                skip.add(field)
            elif (field, code) not in self._logged:
                self._logged.add((field, code))
                log.warning("GPU %d: reading %s failed: %s", index, field, exc)
            return None

    def fields(self, index: int, handle: Any, wanted: dict[str, Any]) -> dict[str, float | None]:
        """Field values by name for ``wanted`` ``{name: field id or (id, scope)}`` in one
        ``nvmlDeviceGetFieldValues`` call; a field the GPU does not report, or whose value
        is no finite number, is None."""
        out: dict[str, float | None] = dict.fromkeys(wanted)
        skip = self.not_reported.setdefault(index, set())
        asked = {k: v for k, v in wanted.items() if k not in skip}
        if not asked:
            return out
        getter = self.nvml.nvmlDeviceGetFieldValues
        values = self.read(index, "field_values", getter, handle, list(asked.values()))
        if values is None:
            return out
        for name, fv in zip(asked, values, strict=True):
            if fv.nvmlReturn == 0:
                out[name] = member(fv.value, _VALUE_MEMBER.get(fv.valueType, "ullVal"))
            elif fv.nvmlReturn == self._lost:
                raise GpuLost(f"GPU {index}: field {name}: GPU is lost")
            else:
                skip.add(name)
        return out
