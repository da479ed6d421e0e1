"""Per-second rates from cumulative counters, with counter wrap and reset handled.

A counter that goes down either wrapped (it is 32 or 64 bits wide and passed its maximum)
or was reset (driver reload, ``perfquery -R``, a NIC reset). Which one is decided from the
previous value: a 32-bit counter that was within the top quarter of its range and comes
back small wrapped (mlx5 ``hw_counters`` are 32-bit: ``mlx5_ib_query_q_counters`` reads
``__be32`` values; IB ``PortCounters`` of old agents are 32-bit); so did a 64-bit one in
its top quarter. Anything else is a reset, and the delta is the new value (the counter
counted from 0 since the reset).

A change no device can make is garbage, not a count: an increase (or, after a reset, a
new value) faster than :data:`MAX_RATE_PER_S` over the time since the previous sample is
noted ``jump`` with no delta and no rate, and the counter starts over from the next sample
(a one-sample spike to ``2**63`` costs that sample, never a rate of exabytes per second).
"""

from __future__ import annotations

from dataclasses import dataclass

_U32 = 1 << 32
_U64 = 1 << 64

MAX_RATE_PER_S = {"bytes": 1e13, "count": 1e10}
"""The fastest any counter read here counts, per second, by unit: 10 TB/s of bytes (over
five times one direction of a GPU's NVLink 5, 1.8 TB/s both ways, the fastest link of a
node), 10**10 packets or events (an 800 Gb/s port sends under 1.2 * 10**9 of its smallest
packets a second)."""


@dataclass(frozen=True, slots=True)
class Change:
    """One counter update."""

    delta: int
    """Increase since the previous value (>= 0), 0 on the first sample."""
    rate_per_s: float
    """``delta`` per second of elapsed time; NaN on the first sample or with no time."""
    note: str
    """"" (plain), "wrap32", "wrap64", "reset" or "jump" (garbage: delta 0, rate NaN)."""


def change(
    prev: int | None, value: int, dt_ns: int, max_rate_per_s: float = MAX_RATE_PER_S["bytes"]
) -> Change:
    """The :class:`Change` from ``prev`` (None: first sample) to ``value`` over ``dt_ns``;
    a delta past ``max_rate_per_s`` over ``dt_ns`` is a ``jump`` (see the module doc).

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
    if dt_ns > 0 and delta > max_rate_per_s * dt_ns / 1e9:
        return Change(0, float("nan"), "jump")
    rate = delta * 1e9 / dt_ns if dt_ns > 0 else float("nan")
    return Change(delta, rate, note)


class CounterSet:
    """Remembers the last value and time of many counters (by key) to turn new readings
    into :class:`Change` s."""

    def __init__(self) -> None:
        self._last: dict[tuple, tuple[int, int]] = {}

    def update(
        self,
        key: tuple,
        value: int,
        now_ns: int,
        max_rate_per_s: float = MAX_RATE_PER_S["bytes"],
    ) -> Change:
        """The change of counter ``key`` to ``value`` at ``now_ns``; remembers it (after
        a ``jump`` it forgets it: the next sample is a first one)."""
        prev = self._last.get(key)
        self._last[key] = (value, now_ns)
        if prev is None:
            return change(None, value, 0)
        ch = change(prev[0], value, now_ns - prev[1], max_rate_per_s)
        if ch.note == "jump":
            del self._last[key]
        return ch

    def forget(self, keep: set[tuple]) -> None:
        """Drop counters whose key is not in ``keep`` (devices that went away)."""
        for key in list(self._last):
            if key not in keep:
                del self._last[key]
