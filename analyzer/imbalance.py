"""Pipeline imbalance: a stage slower than the others by design, not a fault.

When every rank of one pipeline stage computes uniformly longer than the ranks of the
other stages (more layers, or the embedding / loss head), no rank stands out among its
same-stage peers, so the straggler test (``straggler.py``) rightly names none; the
pipeline still runs at the pace of its slowest stage. This module reports it as its own
finding kind, ``pipeline_imbalance`` (cause ``stage_imbalance``, severity low), with the
impact of rebalancing the stages:

- per rank, the median compute self time per step (forward + backward + optimizer, the
  straggler test's input) over the analyzed steps; per stage, the median over its ranks;
- imbalanced: the slowest stage's median is at least ``min_ratio`` times the median of the
  other stages', and so is the ``uniform_quantile`` of its ranks (the whole stage, not a
  few of its ranks); stages need at least two ranks (with one, a slow stage and a slow rank
  cannot be told apart);
- impact: a what-if replay (``slice_replay.py``) of one pipeline slice without stragglers
  with the stages' work spread evenly; without a replay, the bottleneck stage's excess
  over the stages' mean per step, over the median step time.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from ranksight.words import counted

from .findings import Finding
from .slice_replay import ReplayError, groups_of, rebalanced, replay_slice, window
from .straggler import COMPUTE_PHASES, self_time


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
    if ratio < cfg.min_ratio or low < cfg.min_ratio:
        return None
    return StageImbalance(
        stage=slow,
        ratio=ratio,
        low_ratio=low,
        stage_ms={int(s): round(float(v) / 1e6, 2) for s, v in medians.items()},
        ranks=int(sizes[slow]),
    )


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
    ``steps``, or none; ``step_ms``: the median step time; ``culprits``: straggler ranks
    (their pipelines are not replayed)."""
    cfg = cfg or ImbalanceConfig()
    found = find_imbalance(rank_compute(totals, steps), coords["pp"], cfg)
    if found is None:
        return [], []
    whatif, notes = _replayed(data, coords, steps, culprits)
    if whatif is None:
        excess = found.stage_ms[found.stage] - float(np.mean(list(found.stage_ms.values())))
        impact = 100.0 * excess / step_ms if step_ms > 0 else 0.0
        whatif = {"method": "estimate: the slow stage's excess over the stages' mean"}
    else:
        impact = whatif["impact_pct"]
    if impact < cfg.min_impact_pct:
        return [], notes
    return [_finding(found, impact, whatif)], notes


def _replayed(data, coords, steps, culprits) -> tuple[dict | None, list[str]]:
    """A rebalanced replay of one pipeline slice with no straggler in it."""
    if getattr(data, "fetch_slice", None) is None or data.groups.empty:
        return None, []
    bad = {(coords.at[r, "dp"], coords.at[r, "tp"]) for r in culprits if r in coords.index}
    pipes = coords.reset_index().groupby(["dp", "tp"])["rank"].apply(list)
    clean = [ranks for key, ranks in pipes.items() if key not in bad]
    if not clean:
        return None, []
    ranks = sorted(clean[0], key=lambda r: coords.at[r, "pp"])
    window_steps = window(data.steps, ranks, min(steps) if steps else 0)
    try:
        if not window_steps:
            raise ReplayError("no step that every rank of the pipeline completed")
        tables = data.fetch_slice(ranks, groups_of(data.groups, ranks), window_steps, [])
        r = replay_slice(tables, rebalanced, ranks)
    except ReplayError as exc:
        return None, [f"what-if replay of the balanced pipeline not used ({exc})"]
    return {
        "method": "replay of one pipeline slice with the stages' work spread evenly",
        "slice_ranks": ranks,
        "steps": window_steps,
        "replayed_step_ms_now": round(float(r.step_ns_now.mean()) / 1e6, 1),
        "replayed_step_ms_balanced": round(float(r.step_ns_changed.mean()) / 1e6, 1),
        "impact_pct": round(max(0.0, r.impact_pct), 1),
    }, []


def _finding(found: StageImbalance, impact: float, whatif: dict) -> Finding:
    summary = (
        f"pipeline stage {found.stage} is slower than the others by design: its "
        f"{counted(found.ranks, 'rank')} {'computes' if found.ranks == 1 else 'all compute'} about {found.ratio:.2f}x the other stages' median "
        f"({found.stage_ms[found.stage]:.1f} ms per step vs "
        f"{', '.join(f'stage {s}: {v:.1f}' for s, v in found.stage_ms.items() if s != found.stage)}"
        f"); not a fault (no rank stands out among its same-stage peers); rebalancing the "
        f"stages would make the step about {impact:.0f}% shorter"
    )
    evidence = {
        "severity": "low",
        "stage": found.stage,
        "stage_compute_ms_per_step": found.stage_ms,
        "ratio_to_other_stages": round(found.ratio, 3),
        "uniform_ratio": round(found.low_ratio, 3),
        "ranks_in_stage": found.ranks,
        "whatif": whatif,
    }
    return Finding(
        kind="pipeline_imbalance",
        cause="stage_imbalance",
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
