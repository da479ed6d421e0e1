"""See every collective and P2P op a training stack issues, at one interception point.

A TorchDispatchMode sees the c10d ops that ``torch.distributed`` calls, DDP's and FSDP2's
buckets and ``torch.distributed.pipelining`` issue (``c10d.allreduce_``, ``c10d.send``...)
and DTensor's functional collectives (``_c10d_functional.all_reduce`` + ``wait_tensor``).
For each op it records: op type, group (stable id + member ranks), per-group sequence
number (P2P: per peer and direction), element counts, dtype, bytes, host enqueue time,
completion time (the Work's future callback, or the return of ``wait_tensor``), and the
time the training thread blocked on it. Blocked time in ``Work.wait`` is also summed
process-wide so phases can subtract it from their duration.

On CPU/gloo the enqueue time is the op's start; device-side start/end from CUDA events
are a later refinement (``start_ns`` equals ``enqueue_ns`` here).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .groups import GroupRegistry

_C = torch._C._distributed_c10d
_PG_TYPE = "__torch__.torch.classes.c10d.ProcessGroup"

# c10d op -> (name, index of the input arg, index of the output arg, P2P direction)
_C10D_OPS: dict[str, tuple[str, int, int, str]] = {
    "allreduce_": ("all_reduce", 0, 0, ""),
    "allreduce_coalesced_": ("all_reduce", 0, 0, ""),
    "allgather_": ("all_gather", 1, 0, ""),
    "_allgather_base_": ("all_gather", 1, 0, ""),
    "allgather_coalesced_": ("all_gather", 1, 0, ""),
    "allgather_into_tensor_coalesced_": ("all_gather", 1, 0, ""),
    "reduce_scatter_": ("reduce_scatter", 1, 0, ""),
    "_reduce_scatter_base_": ("reduce_scatter", 1, 0, ""),
    "reduce_scatter_tensor_coalesced_": ("reduce_scatter", 1, 0, ""),
    "broadcast_": ("broadcast", 0, 0, ""),
    "reduce_": ("reduce", 0, 0, ""),
    "gather_": ("gather", 1, 0, ""),
    "scatter_": ("scatter", 1, 0, ""),
    "alltoall_": ("all_to_all", 1, 0, ""),
    "alltoall_base_": ("all_to_all", 1, 0, ""),
    "barrier": ("barrier", -1, -1, ""),
    "monitored_barrier_": ("barrier", -1, -1, ""),
    "send": ("send", 0, 0, "send"),
    "recv_": ("recv", 0, 0, "recv"),
    "recv_any_source_": ("recv", 0, 0, "recv_any"),
}
_FUNCTIONAL_OPS: dict[str, str] = {
    "all_reduce": "all_reduce",
    "all_reduce_": "all_reduce",
    "all_reduce_coalesced": "all_reduce",
    "all_reduce_coalesced_": "all_reduce",
    "all_gather_into_tensor": "all_gather",
    "all_gather_into_tensor_out": "all_gather",
    "all_gather_into_tensor_coalesced": "all_gather",
    "reduce_scatter_tensor": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "all_to_all_single": "all_to_all",
    "broadcast": "broadcast",
    "broadcast_": "broadcast",
}


_MAX_PENDING = 10_000
"""Functional collectives awaiting their wait_tensor; past this the oldest is emitted
unfinished (end_ns 0)."""


def _key(t: torch.Tensor) -> int:
    """Identity of a tensor's memory, shared by the wrappers around it."""
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return id(t)


def _tensors(x: Any) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for item in x for t in _tensors(item)]
    return []


def _sizes(x: Any) -> tuple[int, int, str]:
    """(element count, bytes, dtype name) of every tensor in ``x``."""
    ts = _tensors(x)
    if not ts:
        return 0, 0, ""
    numel = sum(t.numel() for t in ts)
    nbytes = sum(t.numel() * t.element_size() for t in ts)
    return numel, nbytes, str(ts[0].dtype).removeprefix("torch.")


class BlockedClock:
    """Process-wide sum of nanoseconds the training threads spent blocked in
    ``Work.wait`` or ``wait_tensor``. Phases read it at entry and exit."""

    def __init__(self) -> None:
        self.total_ns = 0


class CollectiveRecorder(TorchDispatchMode):
    """The dispatch mode. ``emit(record)`` receives one dict per completed op with the
    ``collectives`` table's columns (less run_id/attempt/rank) and ``"t": "collectives"``;
    ``context()`` returns the current ``(step, phase)`` to tag it with."""

    def __init__(
        self,
        emit: Callable[[dict[str, Any]], None],
        context: Callable[[], tuple[int, str]],
        clock: BlockedClock,
    ) -> None:
        super().__init__()
        self._emit = emit
        self._context = context
        self._clock = clock
        self._groups = GroupRegistry()
        self._seq: dict[Any, int] = {}
        self._pending_functional: dict[int, dict[str, Any]] = {}
        self._no_future: list[tuple[dict[str, Any], Any]] = []
        self._local = threading.local()
        self.errors = 0
        self.last_error = ""

    # ------------------------------------------------------------------ dispatch
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        ns = func.namespace
        if ns == "c10d":
            return self._c10d(func, args, kwargs)
        if ns == "_c10d_functional":
            return self._functional(func, args, kwargs)
        return func(*args, **kwargs)

    def _next_seq(self, key: Any) -> int:
        seq = self._seq.get(key, 0)
        self._seq[key] = seq + 1
        return seq

    def _base(self, op: str, info, seq: int, peer: int, x_in: Any, x_out: Any) -> dict[str, Any]:
        step, phase = self._context()
        n_in, b_in, dtype = _sizes(x_in)
        n_out, b_out, dtype_out = _sizes(x_out)
        return {
            "t": "collectives",
            "step": step,
            "phase": phase,
            "group_id": info.group_id,
            "group_ranks": info.ranks_str,
            "group_seq": seq,
            "op": op,
            "peer": peer,
            "dtype": dtype or dtype_out,
            "numel_in": n_in,
            "numel_out": n_out,
            "bytes": max(b_in, b_out),
            "enqueue_ns": 0,
            "start_ns": 0,
            "end_ns": 0,
            "wait_ns": 0,
        }

    def _note_error(self, e: BaseException) -> None:
        self.errors += 1
        self.last_error = f"{type(e).__name__}: {e}"

    def _c10d(self, func, args, kwargs):
        spec = _C10D_OPS.get(func._opname)
        if spec is None:
            return func(*args, **kwargs)
        t0 = time.time_ns()
        out = func(*args, **kwargs)
        try:
            self._record_c10d(spec, args, out, t0)
        except Exception as e:  # never let bookkeeping break training
            self._note_error(e)
        return out

    def _record_c10d(self, spec, args, out, t0: int) -> None:
        name, i_in, i_out, direction = spec
        pg = next(
            a
            for a in args
            if isinstance(a, torch.ScriptObject) and a._type().qualified_name() == _PG_TYPE
        )
        info = self._groups.by_group(_C.ProcessGroup.unbox(pg))
        peer = -1
        if direction:
            if direction != "recv_any":  # send/recv: the first int argument is the peer
                peer = info.global_rank(next((a for a in args if isinstance(a, int)), -1))
            seq = self._next_seq((info.group_id, direction, peer))
        else:
            seq = self._next_seq(info.group_id)
        x_in = args[i_in] if i_in >= 0 else None
        x_out = args[i_out] if i_out >= 0 else None
        rec = self._base(name, info, seq, peer, x_in, x_out)
        rec["enqueue_ns"] = rec["start_ns"] = t0
        self._local.last_c10d = rec
        work = _C.Work.unbox(out[-1] if isinstance(out, (tuple, list)) else out)
        try:
            fut = work.get_future()
        except RuntimeError:  # gloo send/recv Work has no future: completed at wait
            self._no_future.append((rec, work))
            return
        fut.add_done_callback(lambda _f, rec=rec: self._complete(rec))

    def poll_no_future(self) -> None:
        """Complete the ops without a future (gloo P2P) whose Work is done; the end time
        is the time of this poll, which runs when any Work.wait returns."""
        if not self._no_future:
            return
        still = []
        for rec, work in self._no_future:
            if work.is_completed():
                self._complete(rec)
            else:
                still.append((rec, work))
        self._no_future = still

    def _complete(self, rec: dict[str, Any]) -> None:
        rec["end_ns"] = time.time_ns()
        self._emit(rec)

    def _functional(self, func, args, kwargs):
        opname = func._opname
        if opname == "wait_tensor":
            if getattr(self._local, "in_async_wait", False):  # timed by the ACT wrapper
                return func(*args, **kwargs)
            t0 = time.time_ns()
            out = func(*args, **kwargs)
            self._waited(args[0] if args else None, t0, time.time_ns())
            return out
        name = _FUNCTIONAL_OPS.get(opname)
        if name is None:
            return func(*args, **kwargs)
        t0 = time.time_ns()
        out = func(*args, **kwargs)
        try:
            group_name = next(
                a for a in reversed(list(args) + list(kwargs.values())) if isinstance(a, str)
            )
            info = self._groups.by_name(group_name)
            rec = self._base(name, info, self._next_seq(info.group_id), -1, args[0], out)
            rec["enqueue_ns"] = rec["start_ns"] = t0
            for t in _tensors(out):
                self._pending_functional[_key(t)] = rec
            if len(self._pending_functional) > _MAX_PENDING:  # never waited: give up on the oldest
                self._emit(self._pending_functional.pop(next(iter(self._pending_functional))))
        except Exception as e:
            self._note_error(e)
        return out

    def _waited(self, tensor: Any, t0: int, t1: int) -> None:
        """A functional collective's output was waited on from t0 to t1 (ns)."""
        self._clock.total_ns += t1 - t0
        if not isinstance(tensor, torch.Tensor):
            return
        rec = self._pending_functional.pop(_key(tensor), None)
        if rec is not None:
            rec["end_ns"], rec["wait_ns"] = t1, t1 - t0
            self._emit(rec)

    def wrap_async_waits(self) -> Callable[[], None]:
        """Patch ``AsyncCollectiveTensor.trigger_wait`` / ``wait``: DTensor waits on its
        collectives' outputs inside another op's dispatch, where this mode is not active,
        so the wait is timed here instead. Returns the undo function."""
        from torch.distributed._functional_collectives import AsyncCollectiveTensor as ACT

        originals = {"trigger_wait": ACT.trigger_wait, "wait": ACT.wait}
        local = self._local

        def timed(name: str):
            original = originals[name]

            def wait(act, *a, **k):
                if name == "trigger_wait" and act.completed:
                    return original(act, *a, **k)
                local.in_async_wait = True
                t0 = time.time_ns()
                try:
                    return original(act, *a, **k)
                finally:
                    local.in_async_wait = False
                    self._waited(act.elem, t0, time.time_ns())

            return wait

        for name in originals:
            setattr(ACT, name, timed(name))

        def undo() -> None:
            for name, fn in originals.items():
                setattr(ACT, name, fn)

        return undo

    def flush_pending(self) -> int:
        """Emit functional ops never waited on (``end_ns`` 0); returns how many."""
        pending = {id(r): r for r in self._pending_functional.values()}
        self._pending_functional.clear()
        pending.update({id(r): r for r, _ in self._no_future})
        self._no_future.clear()
        for rec in pending.values():
            self._emit(rec)
        return len(pending)

    # ------------------------------------------------------------------ Work.wait
    def wrap_work_wait(self) -> Callable[[], None]:
        """Patch ``Work.wait`` to add blocked time to the clock (and to the last c10d op
        this thread issued, when not yet waited on). Returns the undo function."""
        original = _C.Work.wait
        clock, local = self._clock, self._local

        def wait(work, *a, **k):
            t0 = time.time_ns()
            try:
                return original(work, *a, **k)
            finally:
                dt = time.time_ns() - t0
                clock.total_ns += dt
                rec = getattr(local, "last_c10d", None)
                if rec is not None and rec["wait_ns"] == 0:
                    rec["wait_ns"] = dt
                local.last_c10d = None
                poll()

        poll = self.poll_no_future
        _C.Work.wait = wait

        def undo() -> None:
            _C.Work.wait = original

        return undo
