"""NaN/Inf loss on a rank: a rank that reported finite losses, then a non-finite one.

Query: the ``steps`` frame's ``loss`` (``queries.STEPS``). Ranks with no loss of their own (every pipeline stage but the last) report NaN on every
step and are never named."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ranksight.ground.vocab import Cause, Kind

from ..findings import Finding, finding_at
from .base import Detector, RunContext, Stage


def nan_onsets(steps: pd.DataFrame) -> dict[int, int]:
    """rank -> first step whose loss is NaN/Inf after at least one finite loss."""
    out = {}
    for rank, rows in steps.sort_values("step").groupby("rank"):
        loss = rows["loss"].to_numpy(dtype=float)
        finite = np.isfinite(loss)
        if not finite.any():
            continue
        first_finite = int(np.argmax(finite))
        bad = np.flatnonzero(~finite[first_finite:])
        if bad.size:
            out[int(rank)] = int(rows["step"].iloc[first_finite + bad[0]])
    return out


def nan_findings(steps: pd.DataFrame, coords: pd.DataFrame) -> list[Finding]:
    """The rank(s) whose loss turned NaN/Inf first."""
    onsets = nan_onsets(steps)
    if not onsets:
        return []
    first = min(onsets.values())
    out = []
    for rank in sorted(r for r, s in onsets.items() if s == first):
        summary = f"loss on rank {rank} became NaN/Inf at step {first} (finite before)"
        out.append(
            finding_at(
                Kind.NAN,
                Cause.NUMERICS,
                rank,
                coords,
                confidence=0.9,
                impact_pct=100.0,
                summary=summary,
                evidence={"first_bad_step": first, "all_onsets": onsets},
            )
        )
    return out


def detect(run: RunContext, found: list[Finding]) -> tuple[list[Finding], list[str]]:
    """:func:`nan_findings` of the run's steps."""
    return nan_findings(run.data.steps, run.coords), []


DETECTOR = Detector(Kind.NAN, Stage.FAULT, detect)
