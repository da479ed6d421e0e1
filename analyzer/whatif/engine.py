"""What-if replay: how long would each step take if some ranks' work took as long as
their peers'?

Method (after Lin et al., "Understanding Stragglers in Large Model Training Using What-if
Analysis", OSDI 2025, section 4; and MegaScale's impact estimate): turn one step's
records into a dependency graph and replay it with changed durations.

- Each rank runs its ops one after another in the recorded order: compute phases last
  their *self* time (duration minus time blocked in collectives inside them).
- A collective (same ``group_id`` and ``group_seq`` on every member) starts when its last
  member arrives and lasts its *transfer* time: the shortest member duration, i.e. the
  last arriver's, which did not wait (a collective's duration includes waiting for the
  last arriver; MegaScale, section 5).
- A send is eager: it costs its sender nothing and makes the data available from the
  moment it is issued; the matching recv (same group, src, dst, ``group_seq``) ends at
  ``max(recv issued, send issued) + transfer`` (transfer: the shorter of the pair's
  durations). This keeps batched send/recv pairs (Megatron's ``send_forward_recv_backward``)
  free of artificial deadlocks.
- Every rank starts the step at 0; the step takes as long as its last op.

:func:`replay` runs the graph; :func:`whatif_slowdown` compares the recorded durations
with the culprits' compute replaced by the median of their same-stage peers (same
``pp``), per (step, phase, microbatch): slowdown ``S = sum(T_now) / sum(T_without)``
(1.97 means the job runs 1.97x faster without the culprit).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np
import pandas as pd

OPS_COLUMNS = ("rank", "step", "t", "kind", "dur_ns", "key", "phase", "microbatch")
"""The op table :func:`ops_from_tables` builds: ``kind`` is compute | coll | send | recv;
``dur_ns`` the self time (compute) or transfer time (communication); ``key`` joins the
members of one collective or the two sides of one P2P transfer."""


class ReplayError(ValueError):
    """The records do not form a graph that can be replayed (a collective or recv whose
    other side never comes). The message names the step and the stuck ops."""


@dataclass(frozen=True, slots=True)
class WhatIf:
    """Replayed step times (ns) with the recorded durations and with the change."""

    step_ns_now: pd.Series
    step_ns_without: pd.Series

    @property
    def slowdown(self) -> float:
        """``sum(now) / sum(without)``: how many times faster the job runs without it."""
        without = float(self.step_ns_without.sum())
        return float(self.step_ns_now.sum()) / without if without > 0 else float("nan")

    @property
    def impact_pct(self) -> float:
        """How much shorter the mean step becomes, percent (``100 * (1 - 1/S)``)."""
        s = self.slowdown
        return 100.0 * (1.0 - 1.0 / s) if s == s and s > 0 else 0.0


def ops_from_tables(phases: pd.DataFrame, collectives: pd.DataFrame) -> pd.DataFrame:
    """The op table (:data:`OPS_COLUMNS`) from raw ``phases`` and ``collectives`` rows
    (store columns; times in ns). Collectives outside a step (step -1) are left out."""
    ph = phases
    compute = pd.DataFrame(
        {
            "rank": ph["rank"].astype(np.int64),
            "step": ph["step"].astype(np.int64),
            "t": ph["start_ns"].astype(np.int64),
            "kind": "compute",
            "dur_ns": (ph["end_ns"] - ph["start_ns"] - ph["wait_ns"]).clip(lower=0).astype(float),
            "key": "",
            "phase": ph["phase"].astype(str),
            "microbatch": ph["microbatch"].astype(np.int64),
        }
    )
    c = collectives[collectives["step"] >= 0]
    dur = (c["end_ns"] - c["start_ns"]).clip(lower=0).astype(float)
    p2p = c["peer"] >= 0
    src = np.where(c["op"] == "send", c["rank"], c["peer"])
    dst = np.where(c["op"] == "send", c["peer"], c["rank"])
    key = np.where(
        p2p,
        c["group_id"] + "|" + pd.Series(src, index=c.index).astype(str) + ">"
        + pd.Series(dst, index=c.index).astype(str) + "#" + c["group_seq"].astype(str),
        c["group_id"] + "#" + c["group_seq"].astype(str),
    )  # fmt: skip
    kind = np.where(p2p, np.where(c["op"] == "send", "send", "recv"), "coll")
    comm = pd.DataFrame(
        {
            "rank": c["rank"].astype(np.int64),
            "step": c["step"].astype(np.int64),
            "t": c["enqueue_ns"].astype(np.int64),
            "kind": kind,
            "dur_ns": dur,
            "key": key,
            "phase": "",
            "microbatch": -1,
        }
    )
    comm["dur_ns"] = comm.groupby("key")["dur_ns"].transform("min")  # transfer: no waiting
    ops = pd.concat([compute, comm], ignore_index=True)
    return ops.sort_values(["step", "rank", "t"], kind="stable", ignore_index=True)


def replay(ops: pd.DataFrame) -> pd.Series:
    """Replay every step of the op table; step -> replayed step time (ns).
    Raises ReplayError when a step cannot finish (see the class)."""
    out = {}
    for step, rows in ops.groupby("step", sort=True):
        out[int(step)] = _replay_step(int(step), rows)
    return pd.Series(out, dtype=float)


def _replay_step(step: int, rows: pd.DataFrame) -> float:
    programs = {
        int(r): list(zip(g["kind"], g["dur_ns"], g["key"], strict=True))
        for r, g in rows.groupby("rank", sort=True)
    }
    size = rows[rows["kind"] == "coll"].groupby("key")["rank"].nunique().to_dict()
    cursor = dict.fromkeys(programs, 0.0)
    pos = dict.fromkeys(programs, 0)
    sent: dict[str, float] = {}
    arrived: dict[str, dict[int, float]] = defaultdict(dict)
    done_at: dict[str, float] = {}
    pending = set(programs)
    while pending:
        moved = False
        for rank in list(pending):
            moved |= _advance(rank, programs[rank], pos, cursor, sent, arrived, done_at, size)
            if pos[rank] >= len(programs[rank]):
                pending.discard(rank)
        if not moved and pending:
            stuck = {r: programs[r][pos[r]][2] for r in sorted(pending)[:8]}
            raise ReplayError(f"step {step}: replay cannot go on; ranks wait at {stuck}")
    return max(cursor.values(), default=0.0)


def _advance(rank, program, pos, cursor, sent, arrived, done_at, size) -> bool:
    """Run ``rank`` as far as it can go; True if it moved."""
    moved = False
    while pos[rank] < len(program):
        kind, dur, key = program[pos[rank]]
        now = cursor[rank]
        if kind == "compute":
            cursor[rank] = now + dur
        elif kind == "send":
            sent.setdefault(key, now)
        elif kind == "recv":
            if key not in sent:
                return moved
            cursor[rank] = max(now, sent[key]) + dur
        else:
            if key not in done_at:
                arrived[key].setdefault(rank, now)
                if len(arrived[key]) < size[key]:
                    return moved
                done_at[key] = max(arrived[key].values()) + dur
            cursor[rank] = done_at[key]
        pos[rank] += 1
        moved = True
    return moved


def peer_median_durations(ops: pd.DataFrame, culprits: list[int], role: pd.Series) -> pd.DataFrame:
    """A copy of ``ops`` whose compute ops of ``culprits`` take the median self time of the
    other ranks with the same role (``role``: rank -> e.g. pipeline stage) for the same
    (step, phase, microbatch). Ops without such peers keep their duration."""
    out = ops.copy()
    comp = out["kind"] == "compute"
    roles = out["rank"].map(role)
    peers = comp & ~out["rank"].isin(culprits)
    med = (
        out[peers]
        .assign(role=roles[peers])
        .groupby(["role", "step", "phase", "microbatch"])["dur_ns"]
        .median()
    )
    mine = comp & out["rank"].isin(culprits)
    idx = pd.MultiIndex.from_arrays(
        [roles[mine], out.loc[mine, "step"], out.loc[mine, "phase"], out.loc[mine, "microbatch"]]
    )
    new = med.reindex(idx).to_numpy()
    out.loc[mine, "dur_ns"] = np.where(np.isnan(new), out.loc[mine, "dur_ns"], new)
    return out


def balanced_stages(ops: pd.DataFrame) -> pd.DataFrame:
    """A copy of ``ops`` whose compute ops all take the median over every rank for the
    same (step, phase, microbatch): the step as if the pipeline stages were balanced."""
    out = ops.copy()
    comp = out["kind"] == "compute"
    med = out[comp].groupby(["step", "phase", "microbatch"])["dur_ns"].transform("median")
    out.loc[comp, "dur_ns"] = med
    return out


def whatif_slowdown(ops: pd.DataFrame, culprits: list[int], role: pd.Series) -> WhatIf:
    """Replay ``ops`` as recorded and with ``culprits``' compute at their same-role peers'
    median (:func:`peer_median_durations`). Raises ReplayError."""
    return WhatIf(replay(ops), replay(peer_median_durations(ops, culprits, role)))
