"""The run overview's series: step time and throughput per step, binned to the screen.

Tokens per step: the sum over data-parallel replicas of the largest token count any rank
of that replica reported (a replica's TP and PP ranks see the same tokens). A run that
records its model FLOPs per token in its meta (``model_flops_per_token``; the reference
trainer does, by PaLM's 6N + 12LHQT) gets the achieved model FLOP/s; one that also
records the peak FLOP/s of a rank (``peak_flops_per_rank``, known for datasheet GPUs,
not for CPUs) gets MFU.
"""

from __future__ import annotations

import json
import math

import pandas as pd

from ranksight.store import Store

from .run import RUN, RunView

# Per bin of steps: wall time of a step (first start to last end over all ranks), the
# slowest rank's own step time, and tokens.
STEP_SERIES = f"""
SELECT intDiv(step, %(sb)s) AS sbin, min(step) AS first_step, count() AS n_steps,
       avg(wall_end - wall_start) AS wall_ns, max(slowest) AS slowest_rank_ns,
       sum(step_tokens) AS tokens_sum, sum(wall_end - wall_start) AS wall_sum
FROM
(
    SELECT step, min(rep_start) AS wall_start, max(rep_end) AS wall_end,
           max(rep_slowest) AS slowest, sum(rep_tokens) AS step_tokens
    FROM
    (
        SELECT step, dp, min(start_ns) AS rep_start, max(end_ns) AS rep_end,
               max(end_ns - start_ns) AS rep_slowest, max(tokens) AS rep_tokens
        FROM
        (
            SELECT rank, step, start_ns, end_ns, tokens FROM steps WHERE {RUN}
        ) AS st
        ALL INNER JOIN
        (
            SELECT rank, any(dp) AS dp FROM ranks WHERE {RUN} GROUP BY rank
        ) AS rk USING (rank)
        GROUP BY step, dp
    ) AS per_replica
    GROUP BY step
) AS per_step
GROUP BY sbin
ORDER BY sbin
"""

STEP_COUNT = f"SELECT uniqExact(step) AS n, max(step) AS hi FROM steps WHERE {RUN}"


def step_series(store: Store, run: RunView, max_points: int = 1000) -> pd.DataFrame:
    """One row per bin of steps (at most ``max_points``): first_step, n_steps, step_ms
    (mean wall time of a step: first start to last end over all ranks), slowest_rank_ms
    (the largest step time of one rank), tokens_per_s, tflops (achieved model TFLOP/s
    of the job) and mfu (fraction): NaN unless the run recorded its FLOPs (module doc).
    Empty if the run has no steps yet. Raises StoreError."""
    got = store.query(STEP_COUNT, run.params)
    if got.empty or int(got["n"].iloc[0]) == 0:
        return pd.DataFrame(columns=_COLUMNS)
    sb = max(1, math.ceil((int(got["hi"].iloc[0]) + 1) / max_points))
    frame = store.query(STEP_SERIES, {**run.params, "sb": sb})
    out = pd.DataFrame(
        {
            "first_step": frame["first_step"].astype(int),
            "n_steps": frame["n_steps"].astype(int),
            "step_ms": frame["wall_ns"].astype(float) / 1e6,
            "slowest_rank_ms": frame["slowest_rank_ns"].astype(float) / 1e6,
            "tokens_per_s": frame["tokens_sum"].astype(float)
            / (frame["wall_sum"].astype(float) / 1e9).where(frame["wall_sum"] > 0),
        }
    )
    meta = run.row.get("meta_json", "")
    out["tflops"] = achieved_tflops(out["tokens_per_s"], meta)
    out["mfu"] = mfu(out["tokens_per_s"], meta, run.row.get("world_size"))
    return out


_COLUMNS = ["first_step", "n_steps", "step_ms", "slowest_rank_ms"]
_COLUMNS += ["tokens_per_s", "tflops", "mfu"]


def flops_of(meta_json: str) -> tuple[float | None, float | None]:
    """(model FLOPs per token, peak FLOP/s per rank) from a run's meta; each None when
    missing or not a positive number."""
    try:
        meta = json.loads(meta_json or "{}")
    except ValueError:
        return None, None
    if not isinstance(meta, dict):
        return None, None
    return _positive(meta.get("model_flops_per_token")), _positive(meta.get("peak_flops_per_rank"))


def _positive(value) -> float | None:
    try:
        got = float(value)
    except (TypeError, ValueError):
        return None
    return got if got > 0 and math.isfinite(got) else None


def achieved_tflops(tokens_per_s: pd.Series, meta_json: str) -> pd.Series:
    """Model TFLOP/s of the whole job per point: tokens/s x model FLOPs per token / 1e12.
    NaN without FLOPs per token."""
    per_token, _ = flops_of(meta_json)
    if per_token is None:
        return pd.Series(float("nan"), index=tokens_per_s.index)
    return tokens_per_s * per_token / 1e12


def mfu(tokens_per_s: pd.Series, meta_json: str, world_size) -> pd.Series:
    """Model FLOPs utilization per point: tokens/s x FLOPs per token / (world size x
    peak FLOP/s per rank) (PaLM, Chowdhery et al. 2022, appendix B). NaN unless both
    FLOPs are recorded."""
    per_token, peak = flops_of(meta_json)
    world = int(world_size or 0)
    if per_token is None or peak is None or world <= 0:
        return pd.Series(float("nan"), index=tokens_per_s.index)
    return tokens_per_s * per_token / (world * peak)
