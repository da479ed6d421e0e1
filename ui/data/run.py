"""One run as the pages see it: its row, its ranks in mesh order, its findings."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from ranksight.analyzer import Finding
from ranksight.analyzer.queries import RANKS, load_findings, resolve_attempt
from ranksight.mesh import MeshAxis
from ranksight.store import Store

RUN = "run_id = %(run_id)s AND attempt = %(attempt)s"
"""The WHERE clause every per-run query starts with."""

ORDERS: dict[str, tuple[str, ...]] = {
    "pp, tp, dp": ("pp", "tp", "dp"),
    "pp, dp, tp": ("pp", "dp", "tp"),
    "dp, pp, tp": ("dp", "pp", "tp"),
    "tp, pp, dp": ("tp", "pp", "dp"),
    "rank": (),
}
"""Rank orders the heatmap, timeline and mesh offer: mesh coordinates, outermost first
(ranks of one pipeline stage together by default), or the plain global rank."""

DATA_COUNT = f"SELECT count() AS n, max(end_ns) AS last_end FROM steps WHERE {RUN}"


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


def data_watermark(store: Store, run: RunView) -> tuple[int, int]:
    """(step rows, last step end ns) of the run: changes whenever new steps land, so
    cached reads keyed on it refresh exactly when there is something new."""
    got = store.query(DATA_COUNT, run.params)
    return int(got["n"].iloc[0]), int(got["last_end"].iloc[0]) if len(got) else 0


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
