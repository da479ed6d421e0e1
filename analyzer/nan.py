"""NaN/Inf loss on a rank: a rank that reported finite losses, then a non-finite one.

Ranks with no loss of their own (every pipeline stage but the last) report NaN on every
step and are never named."""

from __future__ import annotations

import numpy as np
import pandas as pd


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
