"""One run as the pages see it: its row, its ranks in mesh order, its findings."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from ranksight.analyzer import Finding
from ranksight.analyzer.queries import RANKS, load_findings, resolve_attempt
from ranksight.ground.mesh import MeshAxis
from ranksight.ground.sql import RUN
from ranksight.store import Store

ORDERS: dict[str, tuple[str, ...]] = {
    "pp, tp, dp": ("pp", "tp", "dp"),
    "pp, dp, tp": ("pp", "dp", "tp"),
    "dp, pp, tp": ("dp", "pp", "tp"),
    "tp, pp, dp": ("tp", "pp", "dp"),
    "rank": (),
}
"""Rank orders the heatmap, timeline and mesh offer: mesh coordinates, outermost first
(ranks of one pipeline stage together by default), or the plain global rank."""

# One query for everything a page's cached reads depend on: new steps, a new analysis,
# a status change or new ranks each move it. Scalar subqueries run on 18.16 and chdb
# (current engines make them Nullable: ifNull keeps the ns exact, not float64).
MARK = f"""
SELECT count() AS n_steps, max(end_ns) AS last_end, min(start_ns) AS first_start,
       min(step) AS lo, max(step) AS hi,
       toInt64(ifNull((SELECT max(analyzed_ns) FROM findings WHERE {RUN}), 0)) AS analyzed,
       toInt64(ifNull((SELECT max(updated_ns) FROM runs WHERE {RUN}), 0)) AS updated,
       toInt64(ifNull((SELECT count() FROM ranks WHERE {RUN}), 0)) AS n_rank_rows
FROM steps WHERE {RUN}
"""


@dataclass(frozen=True)
class RunView:
    """A run attempt: its ``runs`` row (dict), its ranks frame (rank, host, local_rank,
    pid, device, backend, world_size, dp, tp, pp) and the latest findings, by impact."""

    run_id: str
    attempt: int
    row: dict
    ranks: pd.DataFrame
    findings: tuple[Finding, ...]

    @property
    def params(self) -> dict:
        """Bound parameters naming this run attempt in SQL."""
        return {"run_id": self.run_id, "attempt": self.attempt}

    @property
    def shape(self) -> dict[str, int]:
        """Mesh sizes {dp, tp, pp} (1 where the run row has none)."""
        return {a.value: max(int(self.row.get(a.value) or 1), 1) for a in MeshAxis}

    @property
    def culprits(self) -> list[int]:
        """Culprit ranks of the findings (those naming one rank), by impact."""
        return [f.culprit_rank for f in self.findings if f.culprit_rank >= 0]


def load_run_view(store: Store, run_id: str, attempt: int | None = None) -> RunView:
    """The run attempt (latest when ``attempt`` is None). Raises UnknownRun naming the
    run, StoreError if the store cannot be read."""
    row, attempt = resolve_attempt(store, run_id, attempt)
    p = {"run_id": run_id, "attempt": attempt}
    ranks = store.query(RANKS, p)
    frame = load_findings(store, run_id, attempt)
    findings = tuple(Finding.from_row(r) for r in frame.to_dict("records"))
    return RunView(
        run_id, attempt, row, ranks, tuple(sorted(findings, key=lambda f: -f.impact_pct))
    )


@dataclass(frozen=True)
class RunMark:
    """A run attempt's data version: cached reads are keyed on it, so they refresh
    exactly when something they show changed (a running job's new steps, a new analysis,
    a status update) and cost no query otherwise. Times in ns since the epoch (0: none)."""

    step_rows: int = 0
    last_end_ns: int = 0
    analyzed_ns: int = 0
    """When the latest analysis (findings) was stored."""
    updated_ns: int = 0
    """The run row's latest update (status changes)."""
    rank_rows: int = 0
    first_step: int = -1
    last_step: int = -1
    """First and last step recorded (-1: none yet)."""
    mean_step_ns: float = 0.0
    """Wall time from the first step's start to the last step's end over the steps seen
    (ns per step; a cheap stand-in for the median step time when judging a stall)."""

    @property
    def steps(self) -> tuple[int, int] | None:
        """(first, last) step recorded; None before the first step lands."""
        return (self.first_step, self.last_step) if self.step_rows else None


MARK_TABLES = ("steps", "findings", "runs", "ranks")
"""The tables :data:`MARK` reads: a run's mark can only change when one of them does."""


def data_watermark(store: Store, run_id: str, attempt: int) -> RunMark:
    """The run attempt's :class:`RunMark` (one query). Raises StoreError."""
    got = store.query(MARK, {"run_id": run_id, "attempt": attempt})
    if got.empty:
        return RunMark()

    def col(name: str) -> int:  # per column: a row would be upcast to float64
        return int(got[name].iloc[0] or 0)

    n = col("n_steps")
    if not n:
        return RunMark(
            analyzed_ns=col("analyzed"), updated_ns=col("updated"), rank_rows=col("n_rank_rows")
        )
    last, first, lo, hi = col("last_end"), col("first_start"), col("lo"), col("hi")
    return RunMark(
        step_rows=n,
        last_end_ns=last,
        analyzed_ns=col("analyzed"),
        updated_ns=col("updated"),
        rank_rows=col("n_rank_rows"),
        first_step=lo,
        last_step=hi,
        mean_step_ns=(last - first) / (hi - lo + 1),
    )


def position_weights(order: tuple[str, ...], shape: dict[str, int]) -> dict[str, int]:
    """Bound parameters ``w_dp, w_tp, w_pp, w_rank`` so that ``w_pp*pp + w_tp*tp +
    w_dp*dp + w_rank*rank`` is a rank's position in ``order`` (outermost axis first;
    ``()`` orders by global rank). Raises ValueError for an axis not in dp/tp/pp."""
    weights = {"w_dp": 0, "w_tp": 0, "w_pp": 0, "w_rank": 0}
    if not order:
        weights["w_rank"] = 1
        return weights
    stride = 1
    for axis in reversed(order):
        if axis not in shape:
            raise ValueError(f"rank order axis {axis!r} is not one of dp, tp, pp")
        weights[f"w_{axis}"] = stride
        stride *= shape[axis]
    return weights


def weights_for(ranks: pd.DataFrame, order: tuple[str, ...], shape: dict[str, int]) -> dict:
    """:func:`position_weights` for ``order``, or for the global rank order when some
    rank has no mesh coordinates (-1) or a coordinate outside ``shape``."""
    coords = ranks[["dp", "tp", "pp"]].astype(int)
    inside = all(((coords[a] >= 0) & (coords[a] < shape[a])).all() for a in ("dp", "tp", "pp"))
    return position_weights(order if inside else (), shape)


def ordered_ranks(
    ranks: pd.DataFrame, order: tuple[str, ...], shape: dict[str, int]
) -> pd.DataFrame:
    """``ranks`` with a ``pos`` column (position in ``order``, see :func:`weights_for`),
    sorted by it."""
    w = weights_for(ranks, order, shape)
    out = ranks.copy()
    out["pos"] = (
        w["w_dp"] * out["dp"].astype(int)
        + w["w_tp"] * out["tp"].astype(int)
        + w["w_pp"] * out["pp"].astype(int)
        + w["w_rank"] * out["rank"].astype(int)
    )
    return out.sort_values(["pos", "rank"]).reset_index(drop=True)


def rank_label(row: dict) -> str:
    """``"r5 dp1 tp1 pp0"``: a rank and its mesh coordinates."""
    return f"r{int(row['rank'])} dp{int(row['dp'])} tp{int(row['tp'])} pp{int(row['pp'])}"
