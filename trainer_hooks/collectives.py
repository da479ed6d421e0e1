"""The ``detailed`` level: see every collective and P2P op at the dispatcher.

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

import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .collective_log import CollectiveLog

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
    "recv_any_source_": ("recv", 0, 0, "recv_any"),  # peer unknown: -1
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


class DispatchRecorder(TorchDispatchMode):
    """The dispatch mode: every c10d op (``dist.*``, DDP's C++ reducer, FSDP2, pipelining)
    and every functional collective (DTensor, forward and backward) becomes a record in
    ``log``. Costs a Python call per tensor op while entered (8-15% of a CPU step), so it
    is the ``detailed`` level, not the default."""

    def __init__(self, log: CollectiveLog) -> None:
        super().__init__()
        self.log = log

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        ns = func.namespace
        if ns == "c10d":
            return self._c10d(func, args, kwargs)
        if ns == "_c10d_functional":
            return self._functional(func, args, kwargs)
        return func(*args, **kwargs)

    def _c10d(self, func, args, kwargs):
        spec = _C10D_OPS.get(func._opname)
        if spec is None or getattr(self.log.local, "in_api", False):
            return func(*args, **kwargs)
        t0 = time.time_ns()
        out = func(*args, **kwargs)
        try:
            self._record_c10d(spec, args, out, t0)
        except Exception as e:  # never let bookkeeping break training
            self.log.note_error(e)
        return out

    def _record_c10d(self, spec, args, out, t0: int) -> None:
        name, i_in, i_out, direction = spec
        pg = next(
            a
            for a in args
            if isinstance(a, torch.ScriptObject) and a._type().qualified_name() == _PG_TYPE
        )
        info = self.log.groups.by_group(_C.ProcessGroup.unbox(pg))
        peer = -1
        if direction in ("send", "recv"):  # the first int argument is the group-local peer
            peer = info.global_rank(next((a for a in args if isinstance(a, int)), -1))
        x_in = args[i_in] if i_in >= 0 else None
        x_out = args[i_out] if i_out >= 0 else None
        rec = self.log.issue(name, info, peer, direction.removesuffix("_any"), x_in, x_out, t0)
        self.log.track_work(rec, out[-1] if isinstance(out, (tuple, list)) else out)

    def _functional(self, func, args, kwargs):
        opname = func._opname
        if opname == "wait_tensor":
            if getattr(self.log.local, "in_wait", False):  # timed by the wait patches
                return func(*args, **kwargs)
            t0 = time.time_ns()
            out = func(*args, **kwargs)
            self.log.waited_on_tensor(args[0] if args else None, t0, time.time_ns())
            return out
        name = _FUNCTIONAL_OPS.get(opname)
        if name is None or getattr(self.log.local, "in_api", False):
            return func(*args, **kwargs)
        t0 = time.time_ns()
        out = func(*args, **kwargs)
        try:
            values = list(args) + list(kwargs.values())
            group_name = next(a for a in reversed(values) if isinstance(a, str))
            info = self.log.groups.by_name(group_name)
            self.log.track_output(self.log.issue(name, info, -1, "", args[0], out, t0), out)
        except Exception as e:
            self.log.note_error(e)
        return out
