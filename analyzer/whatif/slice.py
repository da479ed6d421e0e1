"""Bounded what-if replay for hooked runs: one pipeline slice, a window of steps.

Replaying every rank of every step (``engine.py``, as for imported runs) costs about 10 s
per million ops: far too much at 16,384 ranks. A straggler's cost flows through its own
pipeline, so the replay takes only the culprit's *pipeline slice* (the ranks with its
``dp`` and ``tp``: one per stage) over a window of at most :data:`MAX_STEPS` steps:

- compute phases and the slice's send/recv pairs are replayed as ``whatif.replay`` does;
- a collective whose other members lie outside the slice (its TP and DP groups) lasts its
  *transfer* time: the shortest member duration of that instance over *all* members
  (the last arriver's, which did not wait; MegaScale, section 5), loaded from the store
  with ``TRANSFER``. The members outside the slice are taken to arrive no later than the
  slice's member (they are peers of the same role; a step's slowest pipeline is the
  culprit's).
- "without": the culprit's phases take the median self time of its same-stage peers (an
  even sample, ``detectors/straggler.py: stage_peers``) for the same (step, phase, microbatch), loaded
  with ``PEER_SELF``.
- "balanced": every forward/backward/optimizer phase of the slice takes the mean over the
  slice's stages for the same (step, phase, microbatch): the same work split evenly over
  the stages (for ``pipeline_imbalance``). That replay holds every pipeline, all
  data-parallel replicas (:func:`replay_ranks`, up to :data:`MAX_RANKS`), so a replica
  that arrives later at the data-parallel all-reduce is replayed, not assumed away.

The impact is ``100 * (1 - sum(without) / sum(now))`` over the window (Lin et al., OSDI
2025, section 4). Queries are bounded by the slice's ranks and groups and the window's
steps; they run on ClickHouse 18.16 and chdb.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ranksight.ground.sql import RUN as _RUN

from .engine import ReplayError, ops_from_tables, replay

MAX_STEPS = 24
"""Most steps replayed (evenly spaced over the window)."""
MAX_ROWS = 300_000
"""Most phase + collective rows of a slice replayed (about 3 s of replay)."""
REBALANCED = ("forward", "backward", "optimizer")
"""Phases whose work moves between stages when the pipeline is rebalanced."""

PHASES = f"""
SELECT rank, step, phase, microbatch, stage, start_ns, end_ns, wait_ns
FROM phases WHERE {_RUN} AND step IN %(steps)s AND rank IN %(ranks)s
"""
COLLECTIVES = f"""
SELECT rank, step, group_id, group_ranks, group_seq, op, peer, enqueue_ns, start_ns, end_ns
FROM collectives
WHERE {_RUN} AND group_id IN %(groups)s AND rank IN %(ranks)s AND step IN %(steps)s
"""
TRANSFER = f"""
SELECT group_id, group_seq, min(end_ns - start_ns) AS transfer_ns
FROM collectives
WHERE {_RUN} AND group_id IN %(groups)s AND step IN %(steps)s AND peer = -1 AND end_ns > 0
GROUP BY group_id, group_seq
"""
"""Per collective instance of the slice's groups: the shortest member duration (ns)."""
PEER_SELF = f"""
SELECT step, phase, microbatch, median(end_ns - start_ns - wait_ns) AS peer_self_ns
FROM phases WHERE {_RUN} AND step IN %(steps)s AND rank IN %(peers)s
GROUP BY step, phase, microbatch
"""
"""Per (step, phase, microbatch): the median self time (ns) over the peers."""


@dataclass(frozen=True, slots=True)
class SliceTables:
    """The rows a slice replay needs (columns as the queries above)."""

    phases: pd.DataFrame
    collectives: pd.DataFrame
    transfer: pd.DataFrame
    peer_self: pd.DataFrame


@dataclass(frozen=True, slots=True)
class SliceReplay:
    """Replayed step times (ns, indexed by step) of one slice."""

    ranks: list[int]
    step_ns_now: pd.Series
    step_ns_changed: pd.Series

    @property
    def impact_pct(self) -> float:
        """How much shorter the mean step becomes with the change, percent."""
        now = float(self.step_ns_now.sum())
        return 100.0 * (1.0 - float(self.step_ns_changed.sum()) / now) if now > 0 else 0.0


def fetch_slice_tables(
    query: Callable[[str, dict], pd.DataFrame],
    params: dict,
    ranks: list[int],
    groups: list[str],
    steps: list[int],
    peers: list[int],
) -> SliceTables:
    """Load a slice's rows. ``query(sql, params)`` runs one query; ``params`` holds run_id
    and attempt; ``groups``: the groups the slice's ranks belong to. Raises what
    ``query`` raises."""
    p = {
        **params,
        "ranks": tuple(int(r) for r in ranks) or (-1,),
        "steps": tuple(int(s) for s in steps) or (-1,),
        "groups": tuple(groups) or ("",),
    }
    peer_self = (
        query(PEER_SELF, {**p, "peers": tuple(int(r) for r in peers)})
        if peers
        else pd.DataFrame(columns=["step", "phase", "microbatch", "peer_self_ns"])
    )
    return SliceTables(query(PHASES, p), query(COLLECTIVES, p), query(TRANSFER, p), peer_self)


def pipeline_slice(coords: pd.DataFrame, rank: int) -> list[int]:
    """The ranks with ``rank``'s dp and tp (one per pipeline stage), by stage."""
    c = coords.loc[rank]
    same = coords[(coords["dp"] == c["dp"]) & (coords["tp"] == c["tp"])]
    return [int(r) for r in same.sort_values("pp").index]


def groups_of(groups: pd.DataFrame, ranks: list[int]) -> list[str]:
    """Ids of the groups (``GROUPS`` rows: group_id, group_ranks) holding any of ``ranks``."""
    want = {str(r) for r in ranks}
    return [
        str(g)
        for g, members in zip(groups["group_id"], groups["group_ranks"], strict=True)
        if want & set(str(members).split(","))
    ]


MAX_RANKS = 256
"""Most ranks one replay holds: every data-parallel replica of the pipelines up to this
many ranks, else the pipelines of one tensor-parallel rank (:func:`replay_ranks`)."""


def replay_ranks(
    coords: pd.DataFrame, left_out: set[tuple[int, int]], limit: int = MAX_RANKS
) -> tuple[list[int], bool]:
    """The ranks of every pipeline (``dp``, ``tp``) not in ``left_out``, by (dp, tp, pp):
    all of them up to ``limit``, else those of the smallest tensor-parallel rank (a
    collective of a TP group then lasts its transfer time), at most ``limit``. Returns
    (ranks, whether every data-parallel replica of those pipelines is in)."""
    keep = [k not in left_out for k in zip(coords["dp"], coords["tp"], strict=True)]
    sub = coords[keep].sort_values(["dp", "tp", "pp"])
    if len(sub) > limit and not sub.empty:
        sub = sub[sub["tp"] == sub["tp"].min()]
    every = len(sub) <= limit and sub["dp"].nunique() == coords["dp"].nunique()
    return [int(r) for r in sub.index[:limit]], every


def measured_step_ms(steps: pd.DataFrame, ranks: list[int], numbers: list[int]) -> float:
    """Mean over ``numbers`` of the step's span over ``ranks`` (first start to last end,
    ms; ``STEPS`` rows), as the replay measures its steps; 0 if none."""
    rows = steps[steps["rank"].isin(ranks) & steps["step"].isin(numbers)]
    if rows.empty:
        return 0.0
    g = rows.groupby("step")
    return float((g["end_ns"].max() - g["start_ns"].min()).mean()) / 1e6


@dataclass(frozen=True, slots=True)
class ReplayFit:
    """How well a replay of the run as it was reproduces the measured step."""

    replayed_ms: float
    """Mean replayed step with nothing changed (ms)."""
    measured_ms: float
    """Mean measured step of the same ranks and steps (ms; 0: none measured)."""

    @property
    def misfit(self) -> float | None:
        """``|replayed / measured - 1|``; None where nothing was measured."""
        return abs(self.replayed_ms / self.measured_ms - 1.0) if self.measured_ms > 0 else None


def replay_fit(steps: pd.DataFrame, r: SliceReplay, numbers: list[int]) -> ReplayFit:
    """The fit of replay ``r`` (over step ``numbers``) to the measured steps of its ranks
    (``STEPS`` rows). The one check before a replay's counterfactual is believed; each
    caller keeps its own tolerance and its own rule where nothing was measured."""
    return ReplayFit(float(r.step_ns_now.mean()) / 1e6, measured_step_ms(steps, r.ranks, numbers))


def window(steps: pd.DataFrame, ranks: list[int], first: int, limit: int = MAX_STEPS) -> list[int]:
    """Up to ``limit`` steps from ``first`` on, evenly spaced, that every one of ``ranks``
    completed (``STEPS`` rows)."""
    mine = steps[steps["rank"].isin(ranks) & (steps["step"] >= first)]
    done = mine.groupby("step")["rank"].nunique()
    full = np.asarray(sorted(done.index[done >= len(set(ranks))]), dtype=int)
    if len(full) > limit:
        full = full[np.linspace(0, len(full) - 1, limit).round().astype(int)]
    return [int(s) for s in full]


def slice_ops(tables: SliceTables) -> pd.DataFrame:
    """The slice's op table (``whatif.OPS_COLUMNS``) with every collective lasting its
    instance's transfer time over all members. Raises ReplayError for no rows."""
    if tables.phases.empty:
        raise ReplayError("no phase records in the slice's window")
    colls = tables.collectives
    if colls.empty:
        colls = pd.DataFrame(
            columns=["rank", "step", "group_id", "group_seq", "op", "peer", "enqueue_ns",
                     "start_ns", "end_ns"]
        )  # fmt: skip
    ops = ops_from_tables(tables.phases, colls)
    # a send and a recv issued at the same instant (batched, as Megatron's
    # send_forward_recv_backward): the send goes first, it never waits
    first = (ops["kind"] != "send").astype(int)
    ops = (
        ops.assign(_first=first)
        .sort_values(["step", "rank", "t", "_first"], kind="stable", ignore_index=True)
        .drop(columns="_first")
    )
    if not tables.transfer.empty:
        key = tables.transfer["group_id"] + "#" + tables.transfer["group_seq"].astype(str)
        transfer = pd.Series(tables.transfer["transfer_ns"].astype(float).to_numpy(), index=key)
        coll = ops["kind"] == "coll"
        new = ops.loc[coll, "key"].map(transfer)
        ops.loc[coll, "dur_ns"] = new.fillna(ops.loc[coll, "dur_ns"]).clip(lower=0)
    return until_next_op(ops)


def until_next_op(ops: pd.DataFrame) -> pd.DataFrame:
    """``ops`` (by step, rank, issue time) with each communication op lasting at most until
    its rank issued its next op of the step: the rank was not blocked past that moment.

    A collective the rank did not wait for at once (issued async, waited later or never:
    a functional all_gather whose end the hooks saw only when something else completed, or
    never) otherwise replays as blocking its rank for the whole span it was in flight
    (seen: an all_gather of 9.3 s in a 0.6 s step, which made the replay 3x the measured
    step). The time the rank did block in it later is in its phase's ``wait_ns``."""
    comm = ops["kind"] != "compute"
    nxt = ops.groupby(["step", "rank"], sort=False)["t"].shift(-1)
    gap = (nxt - ops["t"]).clip(lower=0)
    clip = comm & gap.notna()
    out = ops.copy()
    out.loc[clip, "dur_ns"] = np.minimum(out.loc[clip, "dur_ns"], gap[clip].astype(float))
    return out


def with_peer_self(ops: pd.DataFrame, rank: int, peer_self: pd.DataFrame) -> pd.DataFrame:
    """A copy of ``ops`` whose compute ops of ``rank`` take the peers' median self time
    for the same (step, phase, microbatch) (``PEER_SELF`` rows); others keep theirs."""
    out = ops.copy()
    if peer_self.empty:
        return out
    med = peer_self.set_index(["step", "phase", "microbatch"])["peer_self_ns"].astype(float)
    mine = (out["kind"] == "compute") & (out["rank"] == rank)
    idx = pd.MultiIndex.from_arrays(
        [out.loc[mine, "step"], out.loc[mine, "phase"], out.loc[mine, "microbatch"]]
    )
    new = med.reindex(idx).to_numpy()
    out.loc[mine, "dur_ns"] = np.where(np.isnan(new), out.loc[mine, "dur_ns"], new)
    return out


def rebalanced(ops: pd.DataFrame) -> pd.DataFrame:
    """A copy of ``ops`` whose :data:`REBALANCED` compute ops take the mean over the
    slice's ranks (stages) for the same (step, phase, microbatch)."""
    out = ops.copy()
    sel = (out["kind"] == "compute") & out["phase"].isin(REBALANCED)
    mean = out[sel].groupby(["step", "phase", "microbatch"])["dur_ns"].transform("mean")
    out.loc[sel, "dur_ns"] = mean
    return out


def replay_slice(
    tables: SliceTables, change: Callable[[pd.DataFrame], pd.DataFrame], ranks: list[int]
) -> SliceReplay:
    """Replay the slice as recorded and with ``change`` applied to its op table. Raises
    ReplayError (no rows, more than :data:`MAX_ROWS`, or a graph that cannot finish)."""
    rows = len(tables.phases) + len(tables.collectives)
    if rows > MAX_ROWS:
        raise ReplayError(f"{rows} op records in the slice (more than {MAX_ROWS})")
    ops = slice_ops(tables)
    return SliceReplay(ranks, replay(ops), replay(change(ops)))
