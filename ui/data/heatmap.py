"""The rank x step heatmap, aggregated in the store to at most rows x cols cells.

Metrics (ns per rank and step; the cell shows the largest value in its bin, so one slow
rank is not averaged away, and the hover also gives the mean):

- ``compute``: self time of forward, backward and optimizer (phase time minus the time
  blocked on collectives inside it), as the analyzer's straggler test uses;
- ``waited``: time this rank waited on others: in each collective, the last member's
  enqueue time minus its own; for a recv, the send's enqueue minus its own (the
  analyzer's arrival-order wait-for edges);
- ``waited_on``: time others waited on this rank: the same waits, charged to the last
  arriver of each collective and to the sender of each send/recv pair;
- ``collective``: time in collectives and send/recv (end minus start), including any
  wait for the last arriver.

Steps the run's per-rank-step summary covers are read from it (``analyzer/summary.py``:
these same queries, run once by the analyzer when it saves findings, and stored), the
others from the raw rows: at 1,024 ranks x 1,000 steps the wait metrics join 22 M
collective rows. The heatmap only reads.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ranksight.analyzer import summary
from ranksight.analyzer.metrics_sql import INNER_QUERIES, METRICS, STEP_WINDOW, inner_query
from ranksight.store import Store

from .run import RUN, RunView, ordered_ranks, weights_for

# The summary's rows (settled steps up to %(covered)s), then the raw rows after them.
_FROM_SUMMARY = f"""
SELECT toInt64(rank) AS r, toInt64(step) AS s, toFloat64(any({{column}})) AS val
FROM {summary.TABLE}
WHERE {RUN} AND {STEP_WINDOW} AND step <= %(covered)s AND bitAnd(has, %(bit)s) != 0
GROUP BY rank, step
"""

_BINNED = f"""
SELECT intDiv(pos, %(rb)s) AS rbin, intDiv(s - %(s_lo)s, %(sb)s) AS sbin,
       max(val) AS vmax, avg(val) AS vmean, argMax(r, val) AS worst_rank,
       argMax(s, val) AS worst_step, count() AS cells
FROM
(
{{inner}}
) AS m
ALL INNER JOIN
(
    SELECT toInt64(rank) AS r,
           toInt64(any(dp) * %(w_dp)s + any(tp) * %(w_tp)s + any(pp) * %(w_pp)s
                   + rank * %(w_rank)s) AS pos
    FROM ranks WHERE {RUN}
    GROUP BY rank
) AS p USING (r)
GROUP BY rbin, sbin
"""

STEP_RANGE = f"SELECT count() AS n, min(step) AS lo, max(step) AS hi FROM steps WHERE {RUN}"


@dataclass(frozen=True)
class Heatmap:
    """A binned rank x step matrix. Arrays are [rows, cols]; values in ms (NaN: no data).

    Row i holds the ranks at positions [i*rank_bin, (i+1)*rank_bin) of the chosen order
    (``row_ranks[i]``, labelled ``row_labels[i]``); column j the steps
    [step_lo + j*step_bin, ...] (first step ``col_steps[j]``). ``worst_rank`` and
    ``worst_step`` name the cell's largest value (-1 where empty)."""

    metric: str
    vmax_ms: np.ndarray
    vmean_ms: np.ndarray
    worst_rank: np.ndarray
    worst_step: np.ndarray
    row_labels: list[str]
    row_ranks: list[list[int]]
    col_steps: list[int]
    rank_bin: int
    step_bin: int
    step_lo: int
    step_hi: int
    culprit_rows: dict[int, int]
    """culprit rank -> the row it is in."""

    @property
    def shape(self) -> tuple[int, int]:
        """(rows, cols)."""
        return self.vmax_ms.shape


def step_range(store: Store, run: RunView) -> tuple[int, int] | None:
    """(first, last) step recorded for the run; None if it has no step records yet."""
    got = store.query(STEP_RANGE, run.params)
    if got.empty or int(got["n"].iloc[0]) == 0:
        return None
    return int(got["lo"].iloc[0]), int(got["hi"].iloc[0])


def load_heatmap(
    store: Store,
    run: RunView,
    metric: str,
    order: tuple[str, ...],
    steps: tuple[int, int],
    max_rows: int,
    max_cols: int,
    use_summary: bool = True,
) -> Heatmap:
    """Bin ``metric`` over the run's ranks (in ``order``, see ``run.position_weights``)
    and steps ``steps`` (inclusive) into at most ``max_rows`` x ``max_cols`` cells, in
    the store. Steps the run's stored summary covers are read from it (unless
    ``use_summary`` is False; ``analyzer/summary.py``), later ones from the raw rows.
    Never writes. Raises ValueError for an unknown metric or empty step range,
    StoreError."""
    if metric not in INNER_QUERIES:
        raise ValueError(f"unknown heatmap metric {metric!r}; known: {', '.join(METRICS)}")
    s_lo, s_hi = steps
    if s_hi < s_lo:
        raise ValueError(f"empty step range {s_lo}..{s_hi}")
    ranks = ordered_ranks(run.ranks, order, run.shape)
    n_pos = int(ranks["pos"].max()) + 1 if len(ranks) else 0
    rb, sb = max(1, math.ceil(n_pos / max_rows)), max(1, math.ceil((s_hi - s_lo + 1) / max_cols))
    params = {**run.params, **weights_for(run.ranks, order, run.shape)}
    params.update(s_lo=s_lo, s_hi=s_hi, rb=rb, sb=sb)
    covered = summary.covered_step(store, run.run_id, run.attempt) if use_summary else None
    params.update(cell_params(metric, covered))
    cells = store.query(_BINNED.format(inner=cell_query(metric, covered, s_lo, s_hi)), params)
    return _assemble(metric, cells, ranks, rb, sb, s_lo, s_hi, run.culprits)


def cell_query(metric: str, covered: int | None, s_lo: int, s_hi: int) -> str:
    """The (r, s, val) query for steps ``s_lo..s_hi``: from the summary up to step
    ``covered`` (None: no summary), from the raw rows after it. Bound parameters: the
    run's, ``s_lo``, ``s_hi``, and with a summary ``covered``, ``t_lo`` (covered + 1)
    and ``bit`` (:func:`cell_params`)."""
    if covered is None or covered < s_lo:
        return inner_query(metric)
    stored = _FROM_SUMMARY.replace("{column}", summary.COLUMNS[metric])
    if covered >= s_hi:
        return stored
    tail = inner_query(metric, "t_lo", "s_hi")
    return f"{stored}\nUNION ALL\n{tail}"


def cell_params(metric: str, covered: int | None) -> dict:
    """The summary's bound parameters of :func:`cell_query` (none without a summary)."""
    if covered is None:
        return {}
    return {"covered": covered, "t_lo": covered + 1, "bit": summary.BITS[metric]}


def _assemble(metric, cells, ranks, rb, sb, s_lo, s_hi, culprits) -> Heatmap:
    """The Heatmap from the binned rows of the query."""
    n_rows = max(1, math.ceil((int(ranks["pos"].max()) + 1) / rb)) if len(ranks) else 0
    n_cols = math.ceil((s_hi - s_lo + 1) / sb)
    grids = {k: np.full((n_rows, n_cols), np.nan) for k in ("vmax", "vmean", "wr", "ws")}
    if not cells.empty:
        i, j = cells["rbin"].to_numpy(int), cells["sbin"].to_numpy(int)
        keep = (i >= 0) & (i < n_rows) & (j >= 0) & (j < n_cols)
        for key, col in (
            ("vmax", "vmax"),
            ("vmean", "vmean"),
            ("wr", "worst_rank"),
            ("ws", "worst_step"),
        ):
            grids[key][i[keep], j[keep]] = cells[col].to_numpy(float)[keep]
    labels, members = row_groups(ranks, rb, n_rows)
    row_of = {int(rk): int(p // rb) for rk, p in zip(ranks["rank"], ranks["pos"], strict=True)}
    return Heatmap(
        metric=metric,
        vmax_ms=grids["vmax"] / 1e6,
        vmean_ms=grids["vmean"] / 1e6,
        worst_rank=np.nan_to_num(grids["wr"], nan=-1).astype(int),
        worst_step=np.nan_to_num(grids["ws"], nan=-1).astype(int),
        row_labels=labels,
        row_ranks=members,
        col_steps=[s_lo + j * sb for j in range(n_cols)],
        rank_bin=rb,
        step_bin=sb,
        step_lo=s_lo,
        step_hi=s_hi,
        culprit_rows={c: row_of[c] for c in culprits if c in row_of},
    )


def row_groups(ranks: pd.DataFrame, rb: int, n_rows: int) -> tuple[list[str], list[list[int]]]:
    """Each row's label (as :func:`bin_label`) and ranks, for ranks sorted by ``pos``
    and ``rb`` positions per row (numpy over the ranks: 16,384 ranks in milliseconds)."""
    labels = ["(no ranks)"] * n_rows
    members: list[list[int]] = [[] for _ in range(n_rows)]
    if ranks.empty:
        return labels, members
    row = ranks["pos"].to_numpy(np.int64) // rb
    cols = {k: ranks[k].to_numpy(np.int64) for k in ("rank", "pp", "tp", "dp")}
    starts = np.flatnonzero(np.r_[True, row[1:] != row[:-1]])
    ends = np.r_[starts[1:], len(row)]
    lo = {k: np.minimum.reduceat(v, starts) for k, v in cols.items()}
    hi = {k: np.maximum.reduceat(v, starts) for k, v in cols.items()}
    for i, (a, b) in enumerate(zip(starts, ends, strict=True)):
        r = int(row[a])
        if not 0 <= r < n_rows:
            continue
        members[r] = cols["rank"][a:b].tolist()
        if b - a == 1:
            labels[r] = f"r{lo['rank'][i]} dp{lo['dp'][i]} tp{lo['tp'][i]} pp{lo['pp'][i]}"
            continue
        parts = [f"{b - a} ranks"]
        for axis in ("pp", "tp", "dp"):
            x, y = int(lo[axis][i]), int(hi[axis][i])
            parts.append(f"{axis}{x}" if x == y else f"{axis}{x}-{y}")
        labels[r] = " ".join(parts)
    return labels, members


def bin_label(ranks: pd.DataFrame) -> str:
    """A row's label: ``"r5 dp1 tp1 pp0"`` for one rank; for several, the count and each
    coordinate's value or range, e.g. ``"64 ranks pp0 tp0 dp0-63"``."""
    if ranks.empty:
        return "(no ranks)"
    if len(ranks) == 1:
        r = ranks.iloc[0]
        return f"r{int(r['rank'])} dp{int(r['dp'])} tp{int(r['tp'])} pp{int(r['pp'])}"
    parts = [f"{len(ranks)} ranks"]
    for axis in ("pp", "tp", "dp"):
        lo, hi = int(ranks[axis].min()), int(ranks[axis].max())
        parts.append(f"{axis}{lo}" if lo == hi else f"{axis}{lo}-{hi}")
    return " ".join(parts)
