"""The timing model behind synthetic runs: a 1F1B pipeline step over a DP x TP x PP mesh.

Per step, every rank loads its batch (``data_wait``), runs the one-forward-one-backward
schedule of its pipeline stage (``m`` microbatches; stage ``p`` does ``min(PP-1-p, m)``
warm-up forwards, then alternates, then drains backwards, as torch's ``Schedule1F1B``),
all-reduces its gradients over its DP group and steps the optimizer.

Inside one microbatch forward or backward the TP members compute (their own time), then
meet in one TP all_reduce (the stand-in for the 2 per transformer block a Megatron layer
issues): each member enqueues it when its compute is done, all complete at the last
arrival plus the transfer time. Stage ``p`` receives each forward input from stage
``p-1`` (same TP index) and each backward input from ``p+1`` by send/recv: the receiver
posts its recv when it is free, the data arrives one P2P latency after the send.

Everything is a numpy array over ``(steps, dp, tp)`` (per op) or ``(steps, dp, pp, tp,
...)``; the only Python loop is over the ``2 * m * PP`` ops of the schedule in dependency
order. Times are float ns from the step's start; ``inf`` means "never happens" (a hang:
what waits on it never completes).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

INF = np.inf


def stage_order(pp: int, m: int, stage: int) -> list[tuple[str, int]]:
    """1F1B op order of ``stage``: ``[("F", 0), ..., ("B", m-1)]`` (after torch's
    ``Schedule1F1B``: ``min(pp - 1 - stage, m)`` warm-up forwards, steady 1F1B, drain)."""
    warm = min(pp - 1 - stage, m)
    ops = [("F", i) for i in range(warm)]
    for i in range(m - warm):
        ops += [("F", warm + i), ("B", i)]
    return ops + [("B", i) for i in range(m - warm, m)]


def topo_order(pp: int, m: int) -> list[tuple[int, int]]:
    """Every ``(stage, slot)`` op in an order where each op comes after the op it receives
    from (forward from ``stage-1``, backward from ``stage+1``) and after its stage's
    previous op. Raises RuntimeError if the schedule deadlocks (it cannot for 1F1B)."""
    orders = [stage_order(pp, m, p) for p in range(pp)]
    done: set[tuple[str, int, int]] = set()
    nxt = [0] * pp
    out: list[tuple[int, int]] = []
    while len(out) < 2 * m * pp:
        moved = False
        for p in range(pp):
            if nxt[p] == len(orders[p]):
                continue
            kind, i = orders[p][nxt[p]]
            dep = (kind, p - 1, i) if kind == "F" else (kind, p + 1, i)
            if 0 <= dep[1] < pp and dep not in done:
                continue
            done.add((kind, p, i))
            out.append((p, nxt[p]))
            nxt[p] += 1
            moved = True
        if not moved:
            raise RuntimeError(f"1F1B schedule deadlocked (pp={pp}, m={m})")
    return out


@dataclass(frozen=True, slots=True)
class StepInputs:
    """Per-step durations (ns) for a chunk of ``S`` steps; shapes in brackets."""

    fwd: np.ndarray
    """[S, DP, PP, TP, m] compute of each microbatch forward."""
    bwd: np.ndarray
    """[S, DP, PP, TP, m] compute of each microbatch backward."""
    data: np.ndarray
    """[S, DP, PP, TP] data loading."""
    optim: np.ndarray
    """[S, DP, PP, TP] optimizer step."""
    tp_comm: np.ndarray
    """[S, DP, PP] TP all_reduce transfer time (after the last arrival) of each TP group."""
    send_delay: np.ndarray
    """[S, DP, PP, TP] extra delay of every send this rank issues."""
    p2p_ns: float
    """P2P latency: recv completes this long after the send is issued (or posted)."""
    dp_comm: np.ndarray
    """[S, PP, TP] DP all_reduce transfer time of each DP group."""


@dataclass(frozen=True, slots=True)
class Timeline:
    """When everything happened in a chunk of steps (float ns from each step's start).

    ``slot`` indexes a stage's ops in issue order (:func:`stage_order`)."""

    start: np.ndarray
    """[S, DP, PP, TP, 2m] op (phase) start: compute begins."""
    enq: np.ndarray
    """[S, DP, PP, TP, 2m] TP all_reduce enqueue (compute done)."""
    end: np.ndarray
    """[S, DP, PP, TP, 2m] op end = TP all_reduce completion."""
    recv_enq: np.ndarray
    """[S, DP, PP, TP, 2m] recv posted for the op's input (nan: no recv, stage 0 F / last B)."""
    recv_end: np.ndarray
    """[S, DP, PP, TP, 2m] recv completion (nan: no recv)."""
    send_enq: np.ndarray
    """[S, DP, PP, TP, 2m] send of the op's output issued (nan: no send)."""
    data_end: np.ndarray
    """[S, DP, PP, TP] data_wait end (it starts at 0)."""
    dp_enq: np.ndarray
    """[S, DP, PP, TP] DP all_reduce enqueue."""
    dp_end: np.ndarray
    """[S, DP, PP, TP] DP all_reduce completion."""
    step_end: np.ndarray
    """[S, DP, PP, TP] optimizer (and step) end."""


def _recv(ready: np.ndarray, sent: np.ndarray, p2p_ns: float) -> np.ndarray:
    """Recv completion: posted at ``ready``, data sent at ``sent``."""
    return np.maximum(ready, sent) + p2p_ns


def simulate(
    x: StepInputs, hang: np.ndarray | None = None, stall: np.ndarray | None = None
) -> Timeline:
    """Run the schedule for every step, DP replica and TP member at once.

    ``hang``: [S, DP, PP, TP] bool, a rank that never enqueues its first TP all_reduce of
    that step (everything that waits on it never completes: ``inf``). ``stall``: [S, DP,
    PP] bool, a TP group whose first all_reduce of that step never completes.
    """
    S, DP, PP, TP, m = x.fwd.shape
    shape5 = (S, DP, PP, TP, 2 * m)
    start, enq, end = np.full(shape5, np.nan), np.full(shape5, np.nan), np.full(shape5, np.nan)
    recv_enq, recv_end = np.full(shape5, np.nan), np.full(shape5, np.nan)
    send_enq = np.full(shape5, np.nan)
    orders = [stage_order(PP, m, p) for p in range(PP)]
    slot_of = {(p, k, i): s for p in range(PP) for s, (k, i) in enumerate(orders[p])}
    free = x.data.copy()  # [S, DP, PP, TP] when each member is next free
    for p, s in topo_order(PP, m):
        kind, i = orders[p][s]
        src = p - 1 if kind == "F" else p + 1
        ready = free[:, :, p, :]
        if 0 <= src < PP:
            src_slot = slot_of[(src, kind, i)]
            sent = end[:, :, src, :, src_slot] + x.send_delay[:, :, src, :]
            send_enq[:, :, src, :, src_slot] = sent
            recv_enq[:, :, p, :, s] = ready
            ready = _recv(ready, sent, x.p2p_ns)
            recv_end[:, :, p, :, s] = ready
        comp = (x.fwd if kind == "F" else x.bwd)[:, :, p, :, i]
        if hang is not None and s == 0:
            comp = np.where(hang[:, :, p, :], INF, comp)
        arrive = ready + comp
        done = arrive.max(axis=2, keepdims=True) + x.tp_comm[:, :, p, None] if TP > 1 else arrive
        if stall is not None and s == 0:
            done = np.where(stall[:, :, p, None], INF, done)
        start[:, :, p, :, s], enq[:, :, p, :, s] = ready, arrive
        end[:, :, p, :, s] = np.broadcast_to(done, arrive.shape)
        free[:, :, p, :] = end[:, :, p, :, s]
    dp_enq = free
    dp_end = dp_enq.max(axis=1, keepdims=True) + x.dp_comm[:, None] if DP > 1 else dp_enq
    dp_end = np.broadcast_to(dp_end, dp_enq.shape)
    return Timeline(
        start=start,
        enq=enq,
        end=end,
        recv_enq=recv_enq,
        recv_end=recv_end,
        send_enq=send_enq,
        data_end=x.data,
        dp_enq=dp_enq,
        dp_end=dp_end,
        step_end=dp_end + x.optim,
    )
