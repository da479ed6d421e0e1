"""Pipeline imbalance: a stage slower than the others through an uneven split of the work.

When every rank of one pipeline stage computes uniformly longer than the ranks of the
other stages (more layers, or the embedding / loss head), no rank stands out among its
same-stage peers, so the straggler test (``straggler.py``) rightly names none; the
pipeline still runs at the pace of its slowest stage. This module reports it as its own
finding kind, ``pipeline_imbalance`` (cause ``stage_imbalance``; no failing rank, so
``ranksight.ground.vocab.NOT_FAULTS``), with the impact of rebalancing the stages and a severity that
follows it (:data:`SEVERITY`):

- per rank, the median compute self time per step (forward + backward + optimizer, the
  straggler test's input) over the analyzed steps; per stage, the median over its ranks;
- imbalanced: the slowest stage's median is at least ``min_ratio`` times the median of the
  other stages', and so is the ``uniform_quantile`` of its ranks (the whole stage, not a
  few of its ranks); stages need at least two ranks (with one, a slow stage and a slow rank
  cannot be told apart); a slowest stage over :data:`NOTE_RATIO` but under the thresholds
  is a note;
- impact: a what-if replay (``whatif/slice.py``) of every pipeline without stragglers, all
  data-parallel replicas where :func:`slice_replay.replay_ranks` holds them, with the
  stages' work spread evenly, used only where its step as it ran is within
  :data:`REPLAY_TOLERANCE` of the measured job step; else :func:`estimate` from the
  measured per-stage compute. Either way with its error in points. An impact under
  ``min_impact_pct`` is a note, not a finding.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from ranksight.ground.vocab import Cause, Kind
from ranksight.ground.words import counted

from ..findings import Finding
from ..impact import job_steps
from ..straggler import COMPUTE_PHASES, self_time
from ..whatif.slice import (
    ReplayError,
    groups_of,
    rebalanced,
    replay_fit,
    replay_ranks,
    replay_slice,
    window,
)
from .base import Detector, RunContext, Stage, of_kind


@dataclass(frozen=True, slots=True, kw_only=True)
class ImbalanceConfig:
    """Thresholds of the pipeline imbalance test."""

    min_ratio: float = 1.2
    """Slowest stage's compute over the other stages' median: 1.2 = 20% slower."""
    uniform_quantile: float = 0.25
    """This quantile of the slow stage's ranks must also be ``min_ratio`` above the others."""
    min_impact_pct: float = 2.0
    """Not reported when rebalancing would shorten the step by less than this (percent)."""

    def __post_init__(self) -> None:
        if self.min_ratio <= 1.0:
            raise ValueError(f"min_ratio must be > 1, got {self.min_ratio}")
        if not 0 <= self.uniform_quantile <= 0.5:
            raise ValueError(f"uniform_quantile must be in [0, 0.5], got {self.uniform_quantile}")


@dataclass(frozen=True, slots=True)
class StageImbalance:
    """The slow stage and the numbers it rests on (ms of compute self time per step)."""

    stage: int
    ratio: float
    low_ratio: float
    """``uniform_quantile`` of the stage's ranks over the other stages' median."""
    stage_ms: dict[int, float]
    ranks: int


def rank_compute(totals: pd.DataFrame, steps: list[int]) -> pd.Series:
    """rank -> median compute self time per step (ns) over ``steps``; ``totals`` as
    ``straggler.find_slow_ranks`` takes them (``PHASE_TOTALS`` or ``PHASES`` rows)."""
    if totals.empty:
        return pd.Series(dtype=float)
    if "compute_self" in totals.columns:
        sub = totals[totals["step"].isin(steps)]
        return sub.groupby("rank")["compute_self"].median().astype(float)
    matrix = self_time(totals, COMPUTE_PHASES)
    if matrix.empty:
        return pd.Series(dtype=float)
    return matrix.loc[:, [s for s in matrix.columns if s in set(steps)]].median(axis=1)


def find_imbalance(
    per_rank: pd.Series, stage: pd.Series, cfg: ImbalanceConfig
) -> StageImbalance | None:
    """The slow stage (see the module docstring), or None. ``per_rank``: rank -> compute
    ns per step; ``stage``: rank -> pipeline stage."""
    found = slowest_stage(per_rank, stage, cfg)
    if found is None or found.ratio < cfg.min_ratio or found.low_ratio < cfg.min_ratio:
        return None
    return found


def slowest_stage(
    per_rank: pd.Series, stage: pd.Series, cfg: ImbalanceConfig
) -> StageImbalance | None:
    """The stage whose ranks compute the most, whatever its ratio (:func:`find_imbalance`
    without the thresholds); None with fewer than two stages of two ranks or more."""
    per_rank = per_rank.dropna()
    stage = stage.reindex(per_rank.index)
    sizes = stage.value_counts()
    if len(sizes) < 2 or sizes.min() < 2:
        return None
    medians = per_rank.groupby(stage).median()
    slow = int(medians.idxmax())
    others = float(medians.drop(slow).median())
    if others <= 0:
        return None
    ratio = float(medians[slow]) / others
    low = float(per_rank[stage == slow].quantile(cfg.uniform_quantile)) / others
    return StageImbalance(
        stage=slow,
        ratio=ratio,
        low_ratio=low,
        stage_ms={int(s): round(float(v) / 1e6, 2) for s, v in medians.items()},
        ranks=int(sizes[slow]),
    )


REPLAY_TOLERANCE = 0.10
"""A what-if replay whose step as it ran is further than this share from the measured job
step of the same ranks and steps is not used: a stage imbalance costs a few to a few tens
of percent, which a replay 2-3x off (a CPU run whose overlapped work replays one op after
the other) would not tell. The estimate (:func:`estimate`) is used instead, with a note."""

SEVERITY = ((20.0, "high"), (5.0, "medium"))
"""Severity from the impact (percent of the job step): >= 20 high, >= 5 medium, else low."""

_MS = 1e6


def severity(impact_pct: float) -> str:
    """``high`` | ``medium`` | ``low`` for an impact in percent (:data:`SEVERITY`)."""
    return next((word for floor, word in SEVERITY if impact_pct >= floor), "low")


@dataclass(frozen=True, slots=True)
class StageCost:
    """What rebalancing the stages would save: percent of the job step, its error in
    points, how it was found, and the figures it came from (``whatif``)."""

    impact_pct: float
    error_pts: float
    method: str
    whatif: dict


def estimate(found: StageImbalance, job_ms: float) -> StageCost:
    """The impact from measured per-stage compute: the job step scaled by the mean stage's
    compute over the slowest stage's, ``100 * (1 - mean / slowest)`` (a pipeline runs at
    the pace of its slowest stage, bubbles included; GPipe, Huang et al. 2019). Its error
    is the gap to the excess alone on the critical path once per step,
    ``100 * (slowest - mean) / job_ms``: the scaled figure overstates by up to that much
    where part of the step (communication, the optimizer's all-reduce) does not shrink.
    On the reference trainer (CPU, dp2 x pp2, ``--layer-split 3,1`` against ``2,2``) it
    gave 27% (±9) where the balanced twin run measured 30%."""
    slow = found.stage_ms[found.stage]
    mean = float(np.mean(list(found.stage_ms.values())))
    scaled = 100.0 * (1.0 - mean / slow) if slow > 0 else 0.0
    critical = 100.0 * (slow - mean) / job_ms if job_ms > 0 else scaled
    return StageCost(
        impact_pct=round(max(0.0, scaled), 1),
        error_pts=round(abs(scaled - critical), 1),
        method="estimate from the measured per-stage compute (the job step scaled by the "
        "mean stage's compute over the slowest stage's)",
        whatif={"slowest_stage_ms": slow, "mean_stage_ms": round(mean, 2),
                "excess_on_critical_path_pct": round(critical, 1)},
    )  # fmt: skip


def imbalance_findings(
    data,
    coords: pd.DataFrame,
    totals: pd.DataFrame,
    steps: list[int],
    step_ms: float,
    culprits: list[int],
    cfg: ImbalanceConfig | None = None,
) -> tuple[list[Finding], list[str]]:
    """The ``pipeline_imbalance`` finding of the run ``data`` (``queries.RunData``) over
    ``steps``, or none, and notes; ``step_ms``: the median step time (used where the run
    has no step records to measure the job step on); ``culprits``: straggler ranks
    (their pipelines are not replayed). An imbalance under ``min_impact_pct`` is a note."""
    cfg = cfg or ImbalanceConfig()
    per_rank = rank_compute(totals, steps)
    found = find_imbalance(per_rank, coords["pp"], cfg)
    if found is None:
        return [], _near(slowest_stage(per_rank, coords["pp"], cfg), cfg)
    wall = job_steps(data.steps, steps)
    job_ms = float(wall.mean()) / _MS if not wall.empty else step_ms
    cost, notes = _replayed(data, coords, steps, culprits)
    cost = cost or estimate(found, job_ms)
    if cost.impact_pct < cfg.min_impact_pct:
        notes.append(
            f"pipeline stage {found.stage} computes {found.ratio:.2f}x the other stages' "
            f"median, but rebalancing the stages would shorten the job step by only "
            f"{cost.impact_pct:.1f}% (±{cost.error_pts:.0f} points, {cost.method}): under the "
            f"{cfg.min_impact_pct:.0f}% threshold for a finding"
        )
        return [], notes
    return [_finding(found, cost, job_ms)], notes


NOTE_RATIO = 1.1
"""A slowest stage this much over the others' median, under ``min_ratio``, is noted."""


def _near(found: StageImbalance | None, cfg: ImbalanceConfig) -> list[str]:
    """A note for a stage imbalance under the thresholds but at least :data:`NOTE_RATIO`."""
    if found is None or found.ratio < NOTE_RATIO:
        return []
    return [
        f"pipeline stage {found.stage} computes {found.ratio:.2f}x the other stages' median "
        f"(its ranks' {cfg.uniform_quantile:.0%} quantile {found.low_ratio:.2f}x): under the "
        f"{cfg.min_ratio:.2f}x threshold for a stage imbalance finding"
    ]


def _replayed(data, coords, steps, culprits) -> tuple[StageCost | None, list[str]]:
    """A rebalanced replay of every pipeline with no straggler in it (every data-parallel
    replica where :func:`slice_replay.replay_ranks` can hold them), used only where it
    reproduces the measured job step within :data:`REPLAY_TOLERANCE`."""
    if getattr(data, "fetch_slice", None) is None or data.groups.empty:
        return None, []
    bad = {(coords.at[r, "dp"], coords.at[r, "tp"]) for r in culprits if r in coords.index}
    ranks, every = replay_ranks(coords, bad)
    if not ranks:
        return None, []
    window_steps = window(data.steps, ranks, min(steps) if steps else 0)
    try:
        if not window_steps:
            raise ReplayError("no step that every rank of the pipelines completed")
        tables = data.fetch_slice(ranks, groups_of(data.groups, ranks), window_steps, [])
        r = replay_slice(tables, rebalanced, ranks)
    except ReplayError as exc:
        return None, [f"what-if replay of the balanced pipelines not used ({exc})"]
    fit = replay_fit(data.steps, r, window_steps)
    now, measured = fit.replayed_ms, fit.measured_ms
    misfit = fit.misfit if fit.misfit is not None else 1.0  # nothing measured: no trust
    if misfit > REPLAY_TOLERANCE:
        return None, [
            f"a what-if replay of the pipelines ({counted(len(ranks), 'rank')}) took {now:.0f} ms "
            f"for a step measured at {measured:.0f} ms over the same ranks and steps (more than "
            f"{REPLAY_TOLERANCE:.0%} off): not used; the stage imbalance's impact is an estimate"
        ]
    notes = [] if every else [
        f"the replay of the balanced pipelines holds {counted(len(ranks), 'rank')}, not every "
        "data-parallel replica: the others are taken to arrive no later"
    ]  # fmt: skip
    impact = max(0.0, r.impact_pct)
    whatif = {
        "slice_ranks": ranks,
        "every_dp_replica": every,
        "steps": window_steps,
        "measured_step_ms": round(measured, 1),
        "replayed_step_ms_now": round(now, 1),
        "replayed_step_ms_balanced": round(float(r.step_ns_changed.mean()) / _MS, 1),
        "impact_pct": round(impact, 1),
    }
    method = (
        f"what-if replay of {counted(len(ranks), 'rank')} with the stages' work spread evenly, "
        f"{misfit:.0%} off the measured step"
    )
    return StageCost(round(impact, 1), round(100.0 * misfit, 1), method, whatif), notes


def _finding(found: StageImbalance, cost: StageCost, job_ms: float) -> Finding:
    impact = cost.impact_pct
    others = ", ".join(f"stage {s}: {v:.1f}" for s, v in found.stage_ms.items() if s != found.stage)
    all_ = "computes" if found.ranks == 1 else "all compute"
    summary = (
        f"pipeline stage {found.stage} is the bottleneck of an uneven split of the work: its "
        f"{counted(found.ranks, 'rank')} {all_} about {found.ratio:.2f}x the other stages' "
        f"median ({found.stage_ms[found.stage]:.1f} ms per step vs {others}), and no rank "
        f"stands out among its same-stage peers; rebalancing the stages would make the job "
        f"step about {impact:.0f}% shorter (±{cost.error_pts:.0f} points, {cost.method}): "
        f"{job_ms * impact / 100:.0f} ms of its {job_ms:.0f} ms, {impact:.0f}% of the run; "
        "that is the gain of an even split of the work, and a split in whole layers can "
        "gain less"
    )
    evidence = {
        "severity": severity(impact),
        "stage": found.stage,
        "stage_compute_ms_per_step": found.stage_ms,
        "ratio_to_other_stages": round(found.ratio, 3),
        "uniform_ratio": round(found.low_ratio, 3),
        "ranks_in_stage": found.ranks,
        "impact_method": "replay" if "slice_ranks" in cost.whatif else "estimate",
        "impact_error_pts": cost.error_pts,
        "job_step_ms": round(job_ms, 1),
        "run_share": round(impact / 100.0, 4),
        "whatif": {"method": cost.method, **cost.whatif},
    }
    return Finding(
        kind=Kind.PIPELINE_IMBALANCE,
        cause=Cause.STAGE_IMBALANCE,
        culprit_rank=-1,
        host="",
        dp=-1,
        tp=-1,
        pp=found.stage,
        confidence=round(float(np.clip(0.5 + (found.low_ratio - 1.0), 0.0, 0.9)), 2),
        impact_pct=round(impact, 1),
        summary=summary,
        evidence=evidence,
    )


def detect(run: RunContext, found: list[Finding]) -> tuple[list[Finding], list[str]]:
    """:func:`imbalance_findings` over the analyzed steps; the straggler findings before
    it name the ranks whose pipelines are not replayed."""
    culprits = [f.culprit_rank for f in of_kind(found, Kind.STRAGGLER)]
    return imbalance_findings(
        run.data, run.coords, run.totals, run.steps_in, run.median_step_ms, culprits
    )


DETECTOR = Detector(Kind.PIPELINE_IMBALANCE, Stage.DESIGN, detect)
