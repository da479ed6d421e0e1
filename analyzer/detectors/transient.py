"""Transient stragglers: slow steps whose slow rank changes from step to step.

A chronic straggler (analyzer/straggler.py) is one rank slow for several steps in a row.
Slowness that moves is missed by that test and by any per-rank median: a Python GC pause
of a few seconds on a different rank every few steps, a long sequence landing on another
data-parallel replica each step, a burst of host contention. In synchronous training each
such step costs the whole job, however briefly each rank is slow.

Method, per analyzed step (all ranks' step records and per-rank self times):

1. The job's step (first rank's start to last rank's end) against the median job step of
   the analyzed steps: a step more than ``step_excess`` over it is slow, and so is one
   only ``lone_step_excess`` over it where one rank's own busy time was ``lone_ratio``
   times its stage's median (step 2).
2. In a slow step, each rank's own busy time (compute and data-loading self time, which
   leaves out the time it waited in collectives) against the median of its pipeline
   stage in that step: the rank with the largest excess is the step's slow rank, if that
   excess explains at least ``explained_share`` of the step's excess. A slow step no
   rank's own work explains (the network, every rank at once) is left to the other tests.
3. Why it was slow: its GC pause time in that step (the hooks' ``gc`` phase) over its
   stage's, its data-loading wait, its tokens over the step's median tokens (a longer
   sequence or a bigger batch: data imbalance), else compute.

Steps whose slow rank is a chronic straggler already named are that straggler's. What is
left is one finding, kind ``transient_straggler``, if at least ``min_steps`` steps cost
at least ``min_run_share`` of the run. Its impact is measured, not modelled: the slow
steps' excess over the median job step, as a share of the run's time over the analyzed
steps. If one rank holds at least ``one_rank_share`` of the slow steps it is named (an
intermittent straggler); else no rank is (``culprit_rank`` -1): no chronic culprit is
named where there is none.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from ranksight.ground.vocab import Kind, cause_of
from ranksight.ground.words import counted, span

from ..findings import Finding, finding_at, rank_place
from ..straggler import COMPUTE_PHASES, DATA_PHASES
from .base import Detector, RunContext, Stage

_MS = 1e6


@dataclass(frozen=True, slots=True, kw_only=True)
class TransientConfig:
    """Thresholds of the transient-straggler test."""

    step_excess: float = 0.5
    """A job step this share over the median job step is slow (0.5 = 50% longer: a loaded
    host's jitter on a CPU job stays under it; a GC pause or a long sequence does not)."""
    lone_step_excess: float = 0.2
    """A job step only this share over the median is slow too where one rank's own busy
    time in it is :attr:`lone_ratio` times its stage's median: a lone rank that slow is no
    host jitter (which slows every rank of a step alike), and the pipeline hides part of
    its excess (a 4x slower rank's step measured 40% longer on 8 gloo ranks)."""
    lone_ratio: float = 2.0
    """See :attr:`lone_step_excess`."""
    explained_share: float = 0.5
    """The slow rank's own excess must be at least this share of the step's excess."""
    min_steps: int = 3
    """At least this many slow steps before a finding (two could be a checkpoint save)."""
    min_run_share: float = 0.05
    """And they must cost at least this share of the analyzed run's time."""
    one_rank_share: float = 0.6
    """One rank holding this share of the slow steps is named as their culprit."""
    cause_share: float = 0.5
    """A sub-cause (GC, data wait, tokens) must explain this share of the rank's excess."""
    token_excess: float = 0.2
    """Tokens this share over the step's median count as a data imbalance."""

    def __post_init__(self) -> None:
        if not 0 < self.lone_step_excess <= self.step_excess or self.lone_ratio < 1:
            raise ValueError(
                f"lone_step_excess must be in (0, step_excess] and lone_ratio >= 1, got "
                f"{self.lone_step_excess}, {self.lone_ratio}"
            )
        for name in ("step_excess", "explained_share", "min_run_share", "one_rank_share"):
            if not 0 < getattr(self, name) <= 1:
                raise ValueError(f"{name} must be in (0, 1], got {getattr(self, name)}")
        if self.min_steps < 1:
            raise ValueError(f"min_steps must be >= 1, got {self.min_steps}")


@dataclass(frozen=True, slots=True)
class SlowStep:
    """One slow step and the rank whose own work made it slow."""

    step: int
    rank: int
    step_excess_ms: float
    """The job step minus the median job step."""
    rank_excess_ms: float
    """The rank's busy time minus its stage's median in that step."""
    cause: str
    """``gc``, ``data_loader``, ``data_imbalance`` or ``compute``."""
    gc_ms: float
    """The rank's GC pause time in that step."""


def slow_steps(
    steps: pd.DataFrame,
    totals: pd.DataFrame,
    stage: pd.Series,
    analyzed: list[int],
    cfg: TransientConfig,
) -> tuple[list[SlowStep], float, float]:
    """The slow steps of ``analyzed`` with their slow ranks (see the module docstring),
    the median job step (ns) and the run's time over the analyzed steps (ns).

    ``steps``: rank, step, start_ns, end_ns[, tokens]; ``totals``: rank, step,
    compute_self, data_self[, gc_self] (ns); ``stage``: rank -> pipeline stage."""
    sub = steps[steps["step"].isin(analyzed)]
    totals = as_totals(totals)
    if sub.empty or totals.empty:
        return [], 0.0, 0.0
    by = sub.groupby("step")
    wall = (by["end_ns"].max() - by["start_ns"].min()).astype(float)
    base = float(wall.median())
    run_ns = float(wall.sum())
    late = wall[wall > base * (1.0 + cfg.lone_step_excess)]
    if late.empty:
        return [], base, run_ns
    t = totals[totals["step"].isin(late.index)].copy()
    t["busy"] = t["compute_self"].astype(float) + t["data_self"].astype(float)
    t["gc"] = t["gc_self"].astype(float) if "gc_self" in t.columns else 0.0
    t["pp"] = t["rank"].map(stage).fillna(-1).astype(int)
    tokens = (
        sub[sub["step"].isin(late.index)].set_index(["rank", "step"])["tokens"].astype(float)
        if "tokens" in sub.columns
        else pd.Series(dtype=float)
    )
    out = []
    for step, rows in t.groupby("step"):
        med = rows.groupby("pp")[["busy", "gc", "data_self"]].transform("median")
        excess = rows["busy"] - med["busy"]
        i = excess.idxmax()
        step_excess = float(late[step]) - base
        if excess[i] < cfg.explained_share * step_excess:
            continue
        lone = float(rows.at[i, "busy"]) >= cfg.lone_ratio * float(med.at[i, "busy"])
        if step_excess < cfg.step_excess * base and not lone:
            continue
        rank = int(rows.at[i, "rank"])
        extra = float(excess[i])
        cause = _cause(rows.loc[i], med.loc[i], extra, tokens, rank, int(step), cfg)
        out.append(
            SlowStep(int(step), rank, step_excess / _MS, extra / _MS, cause, rows.at[i, "gc"] / _MS)
        )
    return out, base, run_ns


def as_totals(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` as per-(rank, step) totals (rank, step, compute_self, data_self,
    gc_self; ns): the store's PHASE_TOTALS rows as they are, or per-phase rows (rank, step,
    phase, self_ns) summed into them."""
    if frame.empty or "compute_self" in frame.columns:
        return frame
    if "phase" not in frame.columns:
        return pd.DataFrame()
    self_ns = frame["self_ns"].astype(float)
    parts = {
        "compute_self": frame["phase"].isin(COMPUTE_PHASES),
        "data_self": frame["phase"].isin(DATA_PHASES),
        "gc_self": frame["phase"] == "gc",
    }
    cols = pd.DataFrame({k: self_ns.where(m, 0.0) for k, m in parts.items()})
    cols[["rank", "step"]] = frame[["rank", "step"]]
    return cols.groupby(["rank", "step"], as_index=False).sum()


def _cause(
    row: pd.Series,
    med: pd.Series,
    extra: float,
    tokens: pd.Series,
    rank: int,
    step: int,
    cfg: TransientConfig,
) -> str:
    """Why ``rank`` was slow in ``step``: GC, data loading, more tokens, else compute."""
    if row["gc"] - med["gc"] >= cfg.cause_share * extra:
        return "gc"
    if float(row["data_self"]) - med["data_self"] >= cfg.cause_share * extra:
        return "data_loader"
    if not tokens.empty and (rank, step) in tokens.index:
        at = tokens.xs(step, level="step")
        mid = float(at.median())
        if mid > 0 and float(tokens[(rank, step)]) > mid * (1.0 + cfg.token_excess):
            return "data_imbalance"
    return "compute"


_WHAT = {
    "gc": "Python garbage-collection pauses",
    "data_loader": "data loading",
    "data_imbalance": "more tokens than the other ranks (sequence-length or batch imbalance)",
    "compute": "its own compute",
}


def transient_findings(
    steps: pd.DataFrame,
    totals: pd.DataFrame,
    coords: pd.DataFrame,
    analyzed: list[int],
    chronic: list[int],
    cfg: TransientConfig | None = None,
) -> tuple[list[Finding], list[str]]:
    """The transient-straggler finding of a run (at most one) and notes; ``chronic``:
    ranks already named as chronic stragglers, whose slow steps are theirs. ``coords``:
    rank -> dp, tp, pp, host."""
    cfg = cfg or TransientConfig()
    found, base, run_ns = slow_steps(steps, totals, coords["pp"], analyzed, cfg)
    found = [s for s in found if s.rank not in chronic]
    if not found:
        return [], []
    cost_ms = sum(s.step_excess_ms for s in found)
    share = cost_ms * _MS / run_ns if run_ns > 0 else 0.0
    if len(found) < cfg.min_steps or share < cfg.min_run_share:
        return [], [
            f"{counted(len(found), 'slow step')} on ranks {span(s.rank for s in found)} "
            f"cost {100 * share:.1f}% of the run: under the threshold for a finding"
        ]
    ranks = pd.Series([s.rank for s in found]).value_counts()
    causes = pd.Series([s.cause for s in found]).value_counts()
    cause = str(causes.index[0])
    top = int(ranks.index[0])
    culprit = top if ranks.iloc[0] >= cfg.one_rank_share * len(found) else -1
    c = coords.loc[culprit] if culprit in coords.index else None
    who = (
        f"{rank_place(culprit, c)} was slow in {counted(int(ranks.iloc[0]), 'step')} of them"
        if c is not None
        else f"{counted(len(ranks), 'different rank')} ({span(ranks.index)}) took turns, "
        f"none slow in more than {counted(int(ranks.iloc[0]), 'step')}: no chronic straggler"
    )
    gc_ms = [s.gc_ms for s in found if s.cause == "gc"]
    pauses = f" of {min(gc_ms) / 1e3:.1f}-{max(gc_ms) / 1e3:.1f} s" if gc_ms else ""
    summary = (
        f"{counted(len(found), 'step')} of {len(analyzed)} ran {found_mean(found):.0f} ms longer "
        f"than the median step ({base / _MS:.0f} ms), each held up by one rank's "
        f"{_WHAT[cause]}{pauses}; {who}; they cost {100 * share:.0f}% of the run"
    )
    evidence = {
        "slow_steps": len(found),
        "analyzed_steps": len(analyzed),
        "median_job_step_ms": round(base / _MS, 1),
        "cost_ms": round(cost_ms, 1),
        "run_share": round(share, 4),
        "ranks": [int(r) for r in ranks.index],
        "steps_by_rank": {str(int(r)): int(n) for r, n in ranks.items()},
        "causes": {str(k): int(v) for k, v in causes.items()},
        "where": "; ".join(
            f"step {s.step}: rank {s.rank} +{s.step_excess_ms:.0f} ms ({s.cause})"
            for s in found[:12]
        )
        + (f"; {len(found) - 12} more" if len(found) > 12 else ""),
        "per_step": [
            {
                "step": s.step,
                "rank": s.rank,
                "step_excess_ms": round(s.step_excess_ms, 1),
                "rank_excess_ms": round(s.rank_excess_ms, 1),
                "cause": s.cause,
                "gc_ms": round(s.gc_ms, 1),
            }
            for s in found
        ],  # fmt: skip
    }
    explained = min(1.0, sum(min(s.rank_excess_ms, s.step_excess_ms) for s in found) / cost_ms)
    return [
        finding_at(
            Kind.TRANSIENT_STRAGGLER,
            cause_of(cause),
            culprit,
            coords,
            confidence=round(float(np.clip(0.5 + 0.35 * explained, 0.0, 0.85)), 2),
            impact_pct=round(100 * share, 1),
            summary=summary,
            evidence=evidence,
        )
    ], []


def found_mean(found: list[SlowStep]) -> float:
    """Mean excess (ms) of the slow steps over the median job step."""
    return float(np.mean([s.step_excess_ms for s in found])) if found else 0.0


def detect(run: RunContext, found: list[Finding]) -> tuple[list[Finding], list[str]]:
    """:func:`transient_findings` over the analyzed steps, leaving out every rank the
    straggler test flagged (culprits and victims: their slow steps are theirs)."""
    return transient_findings(
        run.data.steps, run.totals, run.coords, run.steps_in, [s.rank for s in run.slow]
    )


DETECTOR = Detector(Kind.TRANSIENT_STRAGGLER, Stage.FAULT, detect)
