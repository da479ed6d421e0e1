"""Analyze part of a run: a window of steps (``--steps 100:200``) or the recent past
(``--since 10m``).

The window is applied to every step-indexed input of the analysis (steps, phase totals
and detail, transfer per step, arrival and P2P waits, the what-if replay's rows); state
that is not per step (progress snapshots, how ranks ended, desync signatures) is kept
whole, since a hang or a crash is judged on the run as it stands.
"""

from __future__ import annotations

import dataclasses
import re
import time
from dataclasses import dataclass

import pandas as pd

from .queries import RunData

_SINCE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d)?\s*$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


@dataclass(frozen=True, slots=True)
class StepWindow:
    """Steps ``first`` .. ``last`` inclusive; None: unbounded on that side."""

    first: int | None = None
    last: int | None = None

    def __post_init__(self) -> None:
        if self.first is not None and self.last is not None and self.first > self.last:
            raise ValueError(f"step window {self.first}:{self.last} is empty (first > last)")

    @property
    def whole(self) -> bool:
        """No bound at all."""
        return self.first is None and self.last is None

    def filter(self, frame: pd.DataFrame, column: str = "step") -> pd.DataFrame:
        """The rows of ``frame`` whose ``column`` is in the window (all if it has none)."""
        if self.whole or frame.empty or column not in frame.columns:
            return frame
        keep = pd.Series(True, index=frame.index)
        if self.first is not None:
            keep &= frame[column] >= self.first
        if self.last is not None:
            keep &= frame[column] <= self.last
        return frame[keep]

    def describe(self) -> str:
        """``steps A-B`` for a report line."""
        lo = "first" if self.first is None else str(self.first)
        hi = "last" if self.last is None else str(self.last)
        return f"steps {lo}-{hi}"


def parse_steps(spec: str) -> StepWindow:
    """``"A:B"``, ``"A:"``, ``":B"`` or ``"N"`` (one step) as a StepWindow. Raises
    ValueError naming the spec if it is none of these or has a negative step."""
    text = spec.strip()
    try:
        if ":" in text:
            lo, hi = text.split(":", 1)
            first = int(lo) if lo.strip() else None
            last = int(hi) if hi.strip() else None
        else:
            first = last = int(text)
    except ValueError:
        raise ValueError(f"--steps {spec!r}: expected A:B, A:, :B or N (step numbers)") from None
    if (first is not None and first < 0) or (last is not None and last < 0):
        raise ValueError(f"--steps {spec!r}: steps count from 0")
    return StepWindow(first, last)


def parse_since(spec: str) -> float:
    """``"90s"``, ``"10m"``, ``"2h"``, ``"1d"`` (a positive number, decimals allowed, and
    a unit: s, m, h or d) as seconds. Raises ValueError naming the spec otherwise: for
    zero, and for a bare number, whose unit would be a guess."""
    m = _SINCE.match(spec)
    if not m or float(m.group(1)) <= 0:
        raise ValueError(f"--since {spec!r}: expected a positive duration like 90s, 10m, 2h, 1d")
    if m.group(2) is None:
        n = m.group(1)
        raise ValueError(
            f"--since {spec!r}: a number needs a unit: {n}s, {n}m, {n}h or {n}d "
            "(seconds, minutes, hours, days)"
        )
    return float(m.group(1)) * _UNIT_S[m.group(2)]


def since_window(data: RunData, seconds: float, now_ns: int | None = None) -> StepWindow:
    """The steps that started within the last ``seconds`` (by the median start over
    ranks); an empty-ended window past the last step if none did."""
    now_ns = now_ns or time.time_ns()
    if data.steps.empty:
        return StepWindow()
    starts = data.steps.groupby("step")["start_ns"].median()
    recent = starts[starts >= now_ns - seconds * 1e9]
    first = int(recent.index.min()) if not recent.empty else int(starts.index.max()) + 1
    return StepWindow(first, None)


def apply_window(data: RunData, window: StepWindow) -> RunData:
    """``data`` restricted to ``window`` (see the module docstring)."""
    if window.whole:
        return data
    w = window.filter

    def wrap(fetch):
        if fetch is None:
            return None

        def windowed(*args, **kwargs):
            out = fetch(*args, **kwargs)
            if isinstance(out, tuple):
                return tuple(w(f) if isinstance(f, pd.DataFrame) else f for f in out)
            return w(out) if isinstance(out, pd.DataFrame) else out

        return windowed

    return dataclasses.replace(
        data,
        steps=w(data.steps),
        phases=w(data.phases),
        phase_totals=w(data.phase_totals),
        arrivals=w(data.arrivals),
        p2p=w(data.p2p),
        transfer=w(data.transfer),
        fetch_phases=wrap(data.fetch_phases),
        fetch_waits=wrap(data.fetch_waits),
        fetch_ops=wrap(data.fetch_ops),
    )
