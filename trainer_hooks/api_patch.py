"""The ``default`` level: see collectives where training code calls them, at no cost to
any other op.

``torch.distributed``'s collective and P2P functions (used by user code, FSDP2,
``replicate``, pipelining's ``batch_isend_irecv``/``isend``/``irecv``, DDP through
its comm hook, ``ddp.py``) and the functional collectives DTensor calls
(``torch.distributed._functional_collectives``) are replaced, in both the public and the
defining module, by wrappers that record the op and call the original. Unlike the
dispatch mode (``detailed``), nothing runs for non-collective ops. Not seen at this level:
collectives issued from C++ only (DDP's reducer without ``ddp.instrument_ddp``, the
backward of ``*_autograd`` functional collectives).
"""

from __future__ import annotations

import functools
import inspect
import sys
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

from torch.distributed import _functional_collectives as funcol
from torch.distributed import distributed_c10d as c10d

from .collective_log import CollectiveLog, sizes_of
from .ddp import instrument_ddp  # noqa: F401 - re-exported: hooks.py imports it here

# name -> (op, input param, output param, direction, peer param, group-local peer param)
_C10D: dict[str, tuple[str, str, str, str, str, str]] = {
    "all_reduce": ("all_reduce", "tensor", "tensor", "", "", ""),
    "all_reduce_coalesced": ("all_reduce", "tensors", "tensors", "", "", ""),
    "all_gather": ("all_gather", "tensor", "tensor_list", "", "", ""),
    "all_gather_into_tensor": ("all_gather", "input_tensor", "output_tensor", "", "", ""),
    "all_gather_single": ("all_gather", "input_tensor", "output_tensor", "", "", ""),
    "all_gather_coalesced": ("all_gather", "input_tensor_list", "output_tensor_lists", "", "", ""),
    "reduce_scatter": ("reduce_scatter", "input_list", "output", "", "", ""),
    "reduce_scatter_tensor": ("reduce_scatter", "input", "output", "", "", ""),
    "reduce_scatter_single": ("reduce_scatter", "input", "output", "", "", ""),
    "broadcast": ("broadcast", "tensor", "tensor", "", "", ""),
    "reduce": ("reduce", "tensor", "tensor", "", "", ""),
    "gather": ("gather", "tensor", "gather_list", "", "", ""),
    "scatter": ("scatter", "scatter_list", "tensor", "", "", ""),
    "all_to_all": ("all_to_all", "input_tensor_list", "output_tensor_list", "", "", ""),
    "all_to_all_single": ("all_to_all", "input", "output", "", "", ""),
    "barrier": ("barrier", "", "", "", "", ""),
    "monitored_barrier": ("barrier", "", "", "", "", ""),
    "send": ("send", "tensor", "tensor", "send", "dst", "group_dst"),
    "isend": ("send", "tensor", "tensor", "send", "dst", "group_dst"),
    "recv": ("recv", "tensor", "tensor", "recv", "src", "group_src"),
    "irecv": ("recv", "tensor", "tensor", "recv", "src", "group_src"),
}
# functional name -> op (the group is the ``group`` parameter, the input ``self``/``inputs``)
_FUNCTIONAL: dict[str, str] = {
    "all_reduce": "all_reduce",
    "all_reduce_coalesced": "all_reduce",
    "all_gather_tensor": "all_gather",
    "all_gather_tensor_autograd": "all_gather",
    "all_gather_single": "all_gather",
    "all_gather_single_autograd": "all_gather",
    "all_gather_single_coalesced": "all_gather",
    "reduce_scatter_single": "reduce_scatter",
    "reduce_scatter_single_autograd": "reduce_scatter",
    "reduce_scatter_single_coalesced": "reduce_scatter",
    "all_gather_into_tensor_coalesced": "all_gather",
    "reduce_scatter_tensor": "reduce_scatter",
    "reduce_scatter_tensor_autograd": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "all_to_all_single": "all_to_all",
    "all_to_all_single_autograd": "all_to_all",
    "broadcast": "broadcast",
    "permute_tensor": "all_to_all",
}


class _Args:
    """Positional index of each parameter of a function, for cheap argument lookup."""

    def __init__(self, fn: Callable) -> None:
        params = inspect.signature(fn).parameters
        self.index = {name: i for i, name in enumerate(params)}
        self.defaults = {n: p.default for n, p in params.items() if p.default is not p.empty}

    def get(self, name: str, args: tuple, kwargs: dict) -> Any:
        if not name:
            return None
        if name in kwargs:
            return kwargs[name]
        i = self.index.get(name)
        if i is not None and i < len(args):
            return args[i]
        return self.defaults.get(name)


def _guarded(
    log: CollectiveLog,
    fn: Callable,
    before: Callable[[tuple, dict, int], Any],
    after: Callable[[Any, Any, int, int], None],
) -> Callable:
    """``fn`` wrapped: ``before(args, kwargs, t0)`` builds the op's record *before* the call
    (so a rank blocked inside a synchronous collective shows as having entered it), ``fn``
    runs, then ``after(record, out, t0, t1)`` completes or tracks it. Bookkeeping errors are
    counted, never raised; nested calls (one API function calling another) record once."""
    local = log.local

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if getattr(local, "in_api", False):
            return fn(*args, **kwargs)
        t0 = time.time_ns()
        rec = None
        try:
            rec = before(args, kwargs, t0)
        except Exception as e:  # never let bookkeeping break training
            log.note_error(e)
        local.in_api = True
        try:
            out = fn(*args, **kwargs)
        finally:
            local.in_api = False
        if rec is not None:
            try:
                after(rec, out, t0, time.time_ns())
            except Exception as e:
                log.note_error(e)
        return out

    return wrapper


def _c10d_wrapper(log: CollectiveLog, fn: Callable, spec: tuple) -> Callable:
    op, p_in, p_out, direction, p_peer, p_gpeer = spec
    lookup = _Args(fn)

    def before(args: tuple, kwargs: dict, t0: int) -> dict | None:
        group = lookup.get("group", args, kwargs)
        if group is c10d.GroupMember.NON_GROUP_MEMBER or (log.native and log.native(group)):
            return None
        info = log.groups.by_group(group)
        peer = -1
        if direction:
            peer = lookup.get(p_peer, args, kwargs)
            if peer is None:
                peer = info.global_rank(lookup.get(p_gpeer, args, kwargs) or 0)
        x_in, x_out = lookup.get(p_in, args, kwargs), lookup.get(p_out, args, kwargs)
        rec = log.issue(op, info, int(peer), direction, x_in, x_out, t0)
        log.enter_call(rec)
        return rec

    def after(rec: dict, out: Any, t0: int, t1: int) -> None:
        log.leave_call(rec)
        if isinstance(out, c10d.Work):  # async: completed by the Work
            log.track_work(rec, out)
        else:  # synchronous: the call blocked until the op completed
            rec["wait_ns"] = t1 - t0
            log.clock.total_ns += t1 - t0
            log.complete(rec, t1)

    return _guarded(log, fn, before, after)


def _functional_wrapper(log: CollectiveLog, fn: Callable, op: str) -> Callable:
    lookup = _Args(fn)
    p_in = "inputs" if "inputs" in lookup.index else "self"

    def before(args: tuple, kwargs: dict, t0: int) -> dict | None:
        group = lookup.get("group", args, kwargs)
        name = funcol._resolve_group_name(group, lookup.get("tag", args, kwargs) or "")
        if log.native and log.native(name):
            return None
        info = log.groups.by_name(name)
        rec = log.issue(op, info, -1, "", lookup.get(p_in, args, kwargs), None, t0)
        log.enter_call(rec)
        return rec

    def after(rec: dict, out: Any, t0: int, t1: int) -> None:
        log.leave_call(rec)
        if not rec["numel_out"]:
            rec["numel_out"], b_out, dtype = sizes_of(out)
            rec["bytes"] = max(rec["bytes"], b_out)
            rec["dtype"] = rec["dtype"] or dtype
        log.track_output(rec, out)

    return _guarded(log, fn, before, after)


def _importers(fn: Any) -> list[tuple[Any, str]]:
    """(module, attribute) of every loaded torch module bound to ``fn``: modules that did
    ``from torch.distributed.distributed_c10d import scatter`` (DTensor's mesh utilities)
    hold their own reference, which must be replaced too."""
    found = []
    for mod_name, module in list(sys.modules.items()):
        if module is None or not mod_name.startswith("torch"):
            continue
        for attr, value in list(getattr(module, "__dict__", {}).items()):
            if value is fn:
                found.append((module, attr))
    return found


def patch_api(log: CollectiveLog) -> Callable[[], None]:
    """Install the wrappers in every loaded torch module that references the originals;
    returns the undo function. Modules imported later that bind the names directly keep
    the originals."""
    saved: list[tuple[Any, str, Any]] = []
    targets: list[tuple[ModuleType, str, Callable[..., Callable], object]]
    targets = [(c10d, n, _c10d_wrapper, spec) for n, spec in _C10D.items()]
    targets += [(funcol, n, _functional_wrapper, op) for n, op in _FUNCTIONAL.items()]
    for home, name, make, spec in targets:
        fn = getattr(home, name, None)
        if fn is None:
            continue
        wrapped = make(log, fn, spec)
        for module, attr in _importers(fn):
            saved.append((module, attr, fn))
            setattr(module, attr, wrapped)

    def undo() -> None:
        for module, name, original in reversed(saved):
            setattr(module, name, original)

    return undo
