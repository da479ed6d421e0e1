"""Per-second rates from cumulative counters, with counter wrap and reset handled.

A counter that goes down either wrapped (it is 32 or 64 bits wide and passed its maximum)
or was reset (driver reload, ``perfquery -R``, a NIC reset). Which one is decided from the
previous value: a 32-bit counter that was within the top quarter of its range and comes
back small wrapped (mlx5 ``hw_counters`` are 32-bit: ``mlx5_ib_query_q_counters`` reads
``__be32`` values; IB ``PortCounters`` of old agents are 32-bit); so did a 64-bit one in
its top quarter. Anything else is a reset, and the delta is the new value (the counter
counted from 0 since the reset).
"""

from __future__ import annotations

from dataclasses import dataclass

_U32 = 1 << 32
_U64 = 1 << 64


@dataclass(frozen=True, slots=True)
class Change:
    """One counter update."""

    delta: int
    """Increase since the previous value (>= 0), 0 on the first sample."""
    rate_per_s: float
    """``delta`` per second of elapsed time; NaN on the first sample or with no time."""
    note: str
    """"" (plain), "wrap32", "wrap64" or "reset"."""


def change(prev: int | None, value: int, dt_ns: int) -> Change:
    """The :class:`Change` from ``prev`` (None: first sample) to ``value`` over ``dt_ns``.

    Raises ValueError for a negative value (counters are unsigned).
    """
    if value < 0:
        raise ValueError(f"counter value must be >= 0, got {value}")
    if prev is None:
        return Change(0, float("nan"), "")
    note = ""
    if value >= prev:
        delta = value - prev
    elif prev < _U32 and prev >= _U32 - _U32 // 4 and value < _U32 // 4:
        delta, note = value + _U32 - prev, "wrap32"
    elif prev >= _U64 - _U64 // 4 and value < _U64 // 4:
        delta, note = value + _U64 - prev, "wrap64"
    else:
        delta, note = value, "reset"
    rate = delta * 1e9 / dt_ns if dt_ns > 0 else float("nan")
    return Change(delta, rate, note)


class CounterSet:
    """Remembers the last value and time of many counters (by key) to turn new readings
    into :class:`Change` s."""

    def __init__(self) -> None:
        self._last: dict[tuple, tuple[int, int]] = {}

    def update(self, key: tuple, value: int, now_ns: int) -> Change:
        """The change of counter ``key`` to ``value`` at ``now_ns``; remembers it."""
        prev = self._last.get(key)
        self._last[key] = (value, now_ns)
        if prev is None:
            return change(None, value, 0)
        return change(prev[0], value, now_ns - prev[1])

    def forget(self, keep: set[tuple]) -> None:
        """Drop counters whose key is not in ``keep`` (devices that went away)."""
        for key in list(self._last):
            if key not in keep:
                del self._last[key]
