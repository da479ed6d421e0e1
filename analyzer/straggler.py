"""Compute stragglers: ranks whose own work is slower than their peers of the same role.

Method (after MegaScale, NSDI 2024, section 5): never blame a rank for a long collective,
since a collective's duration includes waiting for the last arriver. Instead compare each
rank's *self time* in a phase (phase duration minus the time it was blocked waiting on
collectives inside it) with the median of its peers of the same pipeline stage (the first
and last stage legitimately differ), step by step. A rank whose ratio stays above the
threshold is a straggler; the ranks that waited for it in collectives are its victims.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from .peers import loo_median, sustained_onset

COMPUTE_PHASES = ("forward", "backward", "optimizer", "gpu_compute")
"""``gpu_compute``: GPU kernel time per step, from imported profiler traces."""
DATA_PHASES = ("data_wait",)


@dataclass(frozen=True, slots=True, kw_only=True)
class StragglerConfig:
    """Thresholds of the straggler test."""

    ratio_threshold: float = 1.25
    """Self time over the same-stage peer median that counts as slow: 1.25 = 25% slower."""
    min_slow_fraction: float = 0.7
    """Share of steps from the onset on that must be slow for a chronic straggler. Not
    every step: a rank starved of CPU on gloo spends some steps' slowness inside the
    collectives it joins, and its own compute looks normal in about one step in four
    (the FSDP2 quota case of ``tests/e2e/test_frameworks_faults.py``: 10 of 14)."""
    min_slow_steps: int = 4
    """At least this many slow steps in a row before anyone is named (three could be a
    burst of contention on a shared host)."""
    data_wait_fraction: float = 0.10
    """Data-loader wait above peers by this share of the step time counts as a stall."""
    skip_steps: int = 1
    """How many of the first recorded steps are ignored (connection set-up, warm-up)."""
    lone_peer_ratio: float = 2.0
    """The compute ratio that counts as slow for a rank with a single same-stage peer
    (two ranks a stage: either could be the odd one; only a large gap names one)."""

    def __post_init__(self) -> None:
        if self.ratio_threshold <= 1.0:
            raise ValueError(f"ratio_threshold must be > 1, got {self.ratio_threshold}")
        if not 0 < self.min_slow_fraction <= 1:
            raise ValueError(f"min_slow_fraction must be in (0, 1], got {self.min_slow_fraction}")
        if self.min_slow_steps < 1 or self.skip_steps < 0:
            raise ValueError("min_slow_steps must be >= 1 and skip_steps >= 0")


@dataclass(frozen=True, slots=True)
class SlowRank:
    """A rank slow against its peers: per-step self time and peer medians (ns)."""

    rank: int
    cause: str  # "compute" | "data_loader"
    onset_step: int
    slow_steps: int
    steps_from_onset: int
    median_ratio: float
    excess_ns: pd.Series  # per step: self time minus peer median, from onset on
    self_ns: pd.Series  # per step
    peer_median_ns: pd.Series  # per step


def self_time(phases: pd.DataFrame, names: tuple[str, ...]) -> pd.DataFrame:
    """Rank x step matrix of summed self time (ns) over the phases ``names``."""
    sub = phases[phases["phase"].isin(names)]
    if sub.empty:
        return pd.DataFrame()
    table = sub.pivot_table(index="rank", columns="step", values="self_ns", aggfunc="sum")
    return table.astype(float)


def peer_median(matrix: pd.DataFrame, role: pd.Series) -> pd.DataFrame:
    """For each rank and step, the median over the *other* ranks with the same role
    (``role`` maps rank -> e.g. pipeline stage). NaN where a rank has no peers."""
    out = np.full(matrix.shape, np.nan)
    roles = role.reindex(matrix.index).to_numpy()
    values = matrix.to_numpy(dtype=float)
    for r in pd.unique(roles):
        rows = np.flatnonzero(roles == r)
        out[rows] = loo_median(values[rows])
    return pd.DataFrame(out, index=matrix.index, columns=matrix.columns)


def _scan(
    matrix: pd.DataFrame, role: pd.Series, is_slow, cause: str, cfg: StragglerConfig
) -> list[SlowRank]:
    if matrix.empty:
        return []
    matrix = matrix.loc[:, sorted(matrix.columns)[cfg.skip_steps :]]
    med = peer_median(matrix, role)
    flags = is_slow(matrix, med).fillna(False).to_numpy(dtype=bool)
    onsets = sustained_onset(flags, cfg.min_slow_steps, cfg.min_slow_fraction)
    steps = np.asarray(matrix.columns)
    found = []
    with np.errstate(divide="ignore", invalid="ignore"):  # no peers or no data: NaN
        ratios = matrix.to_numpy(dtype=float) / med.to_numpy(dtype=float)
    ratios[ratios == np.inf] = np.nan  # a peer median of 0: no ratio
    for i in np.flatnonzero(onsets >= 0):
        r, first = matrix.index[i], settled_onset(ratios[i], int(onsets[i]))
        own, peer = matrix.iloc[i, first:], med.iloc[i, first:]
        ratio = ratios[i, first:]
        found.append(
            SlowRank(
                rank=int(r),
                cause=cause,
                onset_step=int(steps[first]),
                slow_steps=int(flags[i, first:].sum()),
                steps_from_onset=len(own),
                median_ratio=float(np.nanmedian(ratio))
                if np.isfinite(ratio).any()
                else float("inf"),
                excess_ns=(own - peer).clip(lower=0),
                self_ns=matrix.iloc[i],
                peer_median_ns=med.iloc[i],
            )
        )
    return found


def settled_onset(ratio: np.ndarray, first: int) -> int:
    """The onset of a sustained slow run that starts at column ``first`` of ``ratio`` (a
    rank's time over its peers' median, per step), moved past leading columns whose
    excess is under half the run's median excess: a step that was slow by noise just
    before a clear onset (e.g. 1.4x before a 4.7x slowdown on a shared host) is not the
    onset. A ramp's onset becomes its first step at least halfway to its level; a walk
    that meets a step without data keeps ``first``."""
    tail = ratio[first:]
    finite = tail[np.isfinite(tail)]
    if finite.size == 0:
        return first
    level = float(np.median(finite))
    if level <= 1.0:
        return first
    half = 1.0 + 0.5 * (level - 1.0)
    j = first
    while j < len(ratio) - 1 and ratio[j] < half:  # NaN (no data) stops the walk
        j += 1
    return j if np.isfinite(ratio[j]) else first


def find_slow_ranks(
    phases: pd.DataFrame,
    role: pd.Series,
    step_time_ns: pd.Series,
    cfg: StragglerConfig | None = None,
) -> list[SlowRank]:
    """Ranks slow in compute (forward + backward + optimizer self time over the peer
    median by ``ratio_threshold``) or in data loading (data_wait above peers by
    ``data_wait_fraction`` of the step time), ordered by total excess time.

    ``phases``: rows (rank, step, phase, self_ns), or one row per (rank, step) with
    ``compute_self`` and ``data_self`` (``queries.PHASE_TOTALS``); ``role``: rank -> pipeline stage;
    ``step_time_ns``: step -> median step duration (ns)."""
    cfg = cfg or StragglerConfig()
    if "compute_self" in phases.columns:  # PHASE_TOTALS: pivoted in the store
        compute = phases.pivot(index="rank", columns="step", values="compute_self").astype(float)
        data = phases.pivot(index="rank", columns="step", values="data_self").astype(float)
    else:
        compute = self_time(phases, COMPUTE_PHASES)
        data = self_time(phases, DATA_PHASES)
    thr = cfg.ratio_threshold
    peers = role.map(role.value_counts()) - 1  # same-stage peers of each rank

    def compute_slow(own: pd.DataFrame, med: pd.DataFrame) -> pd.DataFrame:
        # against one peer there is no majority to say which of the two is off: a rank
        # is named only if it is far slower (LONE_PEER_RATIO), not merely the slower one
        n = peers.reindex(own.index).fillna(0).to_numpy()
        factor = np.where(n >= 2, thr, max(thr, cfg.lone_peer_ratio))
        return own.gt(med.mul(factor, axis=0))

    def data_slow(own: pd.DataFrame, med: pd.DataFrame) -> pd.DataFrame:
        budget = cfg.data_wait_fraction * step_time_ns.reindex(own.columns)
        return (own - med).gt(budget, axis=1)

    found = _scan(compute, role, compute_slow, "compute", cfg)
    found += _scan(data, role, data_slow, "data_loader", cfg)
    return sorted(found, key=lambda s: -float(s.excess_ns.sum()))
