"""Rows of the store's tables from a synthetic :class:`~ranksight.synthetic.timeline.Timeline`.

Every frame is built with numpy over whole arrays (no Python loop over ranks or rows).
Columns are the store schema's (``store/schema.py``); ``run_id`` and ``attempt`` are
added by the caller. Ops that never completed (``inf`` end, a hang) keep ``end_ns = 0``
in ``collectives`` when they were enqueued, as the hooks record an op that was issued and
never finished; phases and steps that never ended are left out (the hooks emit them at
their end).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from ranksight.synthetic.timeline import Timeline, stage_order


@dataclass(frozen=True, slots=True)
class Mesh:
    """The mesh, its groups and the per-rank strings rows repeat (object arrays)."""

    dp: int
    tp: int
    pp: int
    m: int
    """Microbatches per step."""
    tp_gid: np.ndarray
    """[world] group_id of each rank's TP group."""
    tp_granks: np.ndarray
    """[world] group_ranks of each rank's TP group."""
    dp_gid: np.ndarray
    dp_granks: np.ndarray
    pp_gid: np.ndarray
    pp_granks: np.ndarray
    act_numel: int
    """Elements of one microbatch activation (TP all_reduce and send/recv payload)."""
    grad_numel: int
    """Elements of this rank's gradient shard (DP all_reduce payload)."""

    @property
    def world(self) -> int:
        """dp * tp * pp."""
        return self.dp * self.tp * self.pp


BYTES_PER_ELEMENT = 2
"""bfloat16 activations and gradients."""


def _flat(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).reshape(-1)


def _ns(t0: np.ndarray, rel: np.ndarray) -> np.ndarray:
    """Absolute int64 ns from per-step origins ``t0`` [S] and relative float times."""
    shape = (-1,) + (1,) * (rel.ndim - 1)
    return (t0.reshape(shape) + np.nan_to_num(rel, nan=0.0, posinf=0.0)).astype(np.int64)


def _minus(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a - b`` where ``inf - inf`` (never completed, never enqueued) is 0."""
    with np.errstate(invalid="ignore"):
        return np.nan_to_num(a - b, nan=0.0, posinf=0.0, neginf=0.0)


def _index(S: int, world: int, extra: int = 1) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(step offset, rank, slot) of each row of an [S, world, extra] block, flattened."""
    s, r, k = np.meshgrid(np.arange(S), np.arange(world), np.arange(extra), indexing="ij")
    return _flat(s), _flat(r), _flat(k)


def steps_frame(tl: Timeline, t0: np.ndarray, step0: int, losses: np.ndarray) -> pd.DataFrame:
    """One row per rank and completed step; ``losses`` [S, world] (NaN: no loss)."""
    S, world = t0.shape[0], losses.shape[1]
    s, r, _ = _index(S, world)
    end = _flat(tl.step_end.reshape(S, world))
    ok = np.isfinite(end)
    frame = pd.DataFrame(
        {
            "rank": r,
            "step": s + step0,
            "start_ns": np.repeat(t0, world).astype(np.int64),
            "end_ns": _flat(_ns(t0, tl.step_end.reshape(S, world))),
            "loss": _flat(losses),
            "tokens": np.full(S * world, 4096, dtype=np.int64),
            "lr": np.full(S * world, 3e-4),
            "rss_bytes": np.full(S * world, 6 << 30, dtype=np.int64),
        }
    )
    return frame[ok]


def _stage_tables(mesh: Mesh) -> tuple[np.ndarray, np.ndarray]:
    """[PP, 2m] phase name and microbatch of every slot."""
    orders = [stage_order(mesh.pp, mesh.m, p) for p in range(mesh.pp)]
    names = np.array([["forward" if k == "F" else "backward" for k, _ in o] for o in orders])
    mbs = np.array([[i for _, i in o] for o in orders])
    return names.astype(object), mbs


def phases_frame(mesh: Mesh, tl: Timeline, t0: np.ndarray, step0: int) -> pd.DataFrame:
    """data_wait, every microbatch forward/backward (wait = blocked in the TP all_reduce),
    and optimizer; phases that never ended are left out."""
    S, world, k2 = t0.shape[0], mesh.world, 2 * mesh.m
    names, mbs = _stage_tables(mesh)
    stage_of = (np.arange(world) // mesh.tp) % mesh.pp
    s, r, k = _index(S, world, k2)
    end = tl.end.reshape(S, world, k2)
    ops = pd.DataFrame(
        {
            "rank": r,
            "step": s + step0,
            "phase": names[stage_of[r], k],
            "microbatch": mbs[stage_of[r], k],
            "stage": stage_of[r],
            "start_ns": _flat(_ns(t0, tl.start.reshape(S, world, k2))),
            "end_ns": _flat(_ns(t0, end)),
            "wait_ns": _flat(np.nan_to_num(_minus(end, tl.enq.reshape(S, world, k2)))),
        }
    )[np.isfinite(_flat(end))]
    s, r, _ = _index(S, world)
    data_end, dp_end = tl.data_end.reshape(S, world), tl.dp_end.reshape(S, world)
    step_end = tl.step_end.reshape(S, world)
    edge = {"rank": r, "step": s + step0, "microbatch": -1, "stage": stage_of[r], "wait_ns": 0}
    data = pd.DataFrame(
        {**edge, "phase": "data_wait", "start_ns": np.repeat(t0, world).astype(np.int64)}
    )
    data["end_ns"] = _flat(_ns(t0, data_end))
    opt = pd.DataFrame({**edge, "phase": "optimizer"})
    opt["start_ns"], opt["end_ns"] = _flat(_ns(t0, dp_end)), _flat(_ns(t0, step_end))
    opt = opt[np.isfinite(_flat(step_end))]
    frame = pd.concat([data, ops, opt], ignore_index=True)
    frame["wait_ns"] = frame["wait_ns"].astype(np.int64)
    return frame


def _collective_frame(cols: dict, enq: np.ndarray, end: np.ndarray, t0: np.ndarray, S: int):
    """:func:`_collective_frame_rows` for [S, ...] arrays with per-step origins ``t0``."""
    return _collective_frame_rows(cols, _flat(enq), _flat(end), np.repeat(t0, enq.size // S))


def tp_collectives(mesh: Mesh, tl: Timeline, t0: np.ndarray, step0: int) -> pd.DataFrame:
    """One TP all_reduce per microbatch forward and backward (group_seq in issue order)."""
    S, world, k2 = t0.shape[0], mesh.world, 2 * mesh.m
    if mesh.tp == 1:
        return pd.DataFrame()
    names, _ = _stage_tables(mesh)
    stage_of = (np.arange(world) // mesh.tp) % mesh.pp
    s, r, k = _index(S, world, k2)
    cols = {
        "rank": r,
        "step": s + step0,
        "phase": names[stage_of[r], k],
        "group_id": mesh.tp_gid[r],
        "group_ranks": mesh.tp_granks[r],
        "group_seq": (s + step0) * k2 + k,
        "op": "all_reduce",
        "peer": -1,
        "dtype": "bfloat16",
        "numel_in": mesh.act_numel,
        "numel_out": mesh.act_numel,
        "bytes": mesh.act_numel * BYTES_PER_ELEMENT,
    }
    return _collective_frame(
        cols, tl.enq.reshape(S, world, k2), tl.end.reshape(S, world, k2), t0, S
    )


def dp_collectives(mesh: Mesh, tl: Timeline, t0: np.ndarray, step0: int) -> pd.DataFrame:
    """One DP gradient all_reduce per rank and step, issued after its last backward."""
    S, world = t0.shape[0], mesh.world
    if mesh.dp == 1:
        return pd.DataFrame()
    s, r, _ = _index(S, world)
    cols = {
        "rank": r,
        "step": s + step0,
        "phase": "",
        "group_id": mesh.dp_gid[r],
        "group_ranks": mesh.dp_granks[r],
        "group_seq": s + step0,
        "op": "all_reduce",
        "peer": -1,
        "dtype": "float32",
        "numel_in": mesh.grad_numel,
        "numel_out": mesh.grad_numel,
        "bytes": mesh.grad_numel * 4,
    }
    return _collective_frame(cols, tl.dp_enq.reshape(S, world), tl.dp_end.reshape(S, world), t0, S)


def _recv_map(mesh: Mesh) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """[PP, 2m] source stage of each slot's input (-1: none), its slot there, microbatch."""
    orders = [stage_order(mesh.pp, mesh.m, p) for p in range(mesh.pp)]
    slot_of = {(p, k, i): s for p in range(mesh.pp) for s, (k, i) in enumerate(orders[p])}
    src = np.full((mesh.pp, 2 * mesh.m), -1)
    src_slot, mb = np.zeros_like(src), np.zeros_like(src)
    for p, order in enumerate(orders):
        for s, (kind, i) in enumerate(order):
            q = p - 1 if kind == "F" else p + 1
            mb[p, s] = i
            if 0 <= q < mesh.pp:
                src[p, s], src_slot[p, s] = q, slot_of[(q, kind, i)]
    return src, src_slot, mb


def p2p_collectives(mesh: Mesh, tl: Timeline, t0: np.ndarray, step0: int) -> pd.DataFrame:
    """Pipeline send/recv pairs: each forward input from stage p-1 and backward input
    from p+1 (same dp, tp). group_seq counts per (group, direction, peer), as the hooks
    do, so a send and its recv share ``(group_id, src, dst, group_seq)``."""
    S, world, k2 = t0.shape[0], mesh.world, 2 * mesh.m
    if mesh.pp == 1:
        return pd.DataFrame()
    src, src_slot, mb = _recv_map(mesh)
    stage_of = (np.arange(world) // mesh.tp) % mesh.pp
    s, r, k = _index(S, world, k2)
    sel = src[stage_of[r], k] >= 0
    s, r, k = s[sel], r[sel], k[sel]
    q = src[stage_of[r], k]
    sender = r + (q - stage_of[r]) * mesh.tp
    seq = (s + step0) * mesh.m + mb[stage_of[r], k]
    recv_end = tl.recv_end.reshape(S, world, k2)[s, r, k]
    recv_enq = tl.recv_enq.reshape(S, world, k2)[s, r, k]
    send_enq = tl.send_enq.reshape(S, world, k2)[s, sender, src_slot[stage_of[r], k]]
    parts = []
    for op, rank, peer, enq in (("recv", r, sender, recv_enq), ("send", sender, r, send_enq)):
        cols = {
            "rank": rank,
            "step": s + step0,
            "phase": "",
            "group_id": mesh.pp_gid[rank],
            "group_ranks": mesh.pp_granks[rank],
            "group_seq": seq,
            "op": op,
            "peer": peer,
            "dtype": "bfloat16",
            "numel_in": mesh.act_numel,
            "numel_out": mesh.act_numel,
            "bytes": mesh.act_numel * BYTES_PER_ELEMENT,
        }
        parts.append(_collective_frame_rows(cols, enq, recv_end, t0[s]))
    return pd.concat(parts, ignore_index=True)


def _collective_frame_rows(cols: dict, enq: np.ndarray, end: np.ndarray, origin: np.ndarray):
    """Like :func:`_collective_frame` for rows already flattened with their own origins."""
    keep = np.isfinite(enq)
    frame = pd.DataFrame(cols)[keep]
    frame["enqueue_ns"] = (origin + np.nan_to_num(enq, posinf=0.0)).astype(np.int64)[keep]
    frame["start_ns"] = frame["enqueue_ns"]
    done = np.isfinite(end)
    val = np.where(done, origin + np.nan_to_num(end, posinf=0.0), 0).astype(np.int64)
    frame["end_ns"] = val[keep]
    frame["wait_ns"] = np.where(done, np.maximum(_minus(end, enq), 0), 0).astype(np.int64)[keep]
    return frame
