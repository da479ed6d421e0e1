"""Slow communication: collectives of one group slow after everyone has arrived.

A collective's time after its last member arrived (``end - max(enqueue)``) is transfer,
not waiting. A group whose transfer time per collective is far above that of the other
groups of the same mesh axis (same op mix, same sizes by construction of the mesh) has a
slow link; the rank(s) shared by every slow group localize it (MegaScale, NSDI 2024, 5.2:
intersect the slow groups).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd


@dataclass(frozen=True, slots=True, kw_only=True)
class SlowCommConfig:
    """Thresholds of the slow-communication test."""

    ratio: float = 2.0
    """Transfer time per collective over the median of same-axis groups that counts as slow."""
    min_excess_ms: float = 2.0
    """And at least this much slower per collective (ms): tiny ops are noisy."""
    min_step_fraction: float = 0.5
    """Share of the analyzed steps on which the group must be slow."""

    def __post_init__(self) -> None:
        if self.ratio <= 1 or self.min_excess_ms < 0 or not 0 < self.min_step_fraction <= 1:
            raise ValueError("ratio must be > 1, min_excess_ms >= 0, min_step_fraction in (0, 1]")


@dataclass(frozen=True)
class SlowGroup:
    """One group slow in transfer: its per-collective transfer and skew (ms), and its
    same-axis peers' median transfer (ms)."""

    group_id: str
    axis: str
    members: list[int]
    transfer_ms: float
    peers_transfer_ms: float
    skew_ms: float
    slow_steps: int
    steps: int


def transfer_matrix(arrivals: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """group x step mean transfer and mean wait per collective instance (ns)."""
    a = arrivals.groupby(["group_id", "step"])[["after_last_ns", "waited_ns", "n"]].sum()
    transfer = (a["after_last_ns"] / a["n"]).unstack("step")
    skew = (a["waited_ns"] / a["n"]).unstack("step")
    return transfer, skew


def find_slow_groups(
    arrivals: pd.DataFrame,
    axes: dict[str, str],
    members: dict[str, list[int]],
    skip_steps: int = 1,
    cfg: SlowCommConfig | None = None,
) -> list[SlowGroup]:
    """Groups whose transfer per collective exceeds the median of the other groups of
    their axis by ``ratio`` and ``min_excess_ms`` on most steps."""
    cfg = cfg or SlowCommConfig()
    if arrivals.empty:
        return []
    transfer, skew = transfer_matrix(arrivals)
    transfer = transfer.loc[:, sorted(transfer.columns)[skip_steps:]]
    found = []
    for axis in {axes.get(g, "mixed") for g in transfer.index}:
        groups = [g for g in transfer.index if axes.get(g, "mixed") == axis]
        if len(groups) < 2 or axis in ("world", "mixed"):
            continue
        for g in groups:
            others = transfer.loc[[o for o in groups if o != g]].median(axis=0)
            own = transfer.loc[g]
            slow = (own > cfg.ratio * others) & ((own - others) > cfg.min_excess_ms * 1e6)
            n = int(own.notna().sum())
            if n and slow.sum() >= max(1, cfg.min_step_fraction * n):
                found.append(SlowGroup(
                    group_id=g, axis=axis, members=members.get(g, []),
                    transfer_ms=float(np.nanmedian(own)) / 1e6,
                    peers_transfer_ms=float(np.nanmedian(others)) / 1e6,
                    skew_ms=float(np.nanmedian(skew.loc[g])) / 1e6,
                    slow_steps=int(slow.sum()), steps=n))  # fmt: skip
    return found


def shared_ranks(groups: list[SlowGroup]) -> list[int]:
    """Ranks that are members of every slow group."""
    if not groups:
        return []
    common = set(groups[0].members)
    for g in groups[1:]:
        common &= set(g.members)
    return sorted(common)
