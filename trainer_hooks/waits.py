"""Time how long the training threads block waiting for collectives.

Two places a thread blocks: ``Work.wait`` (c10d ops: dist.* sync calls wait inside,
async callers wait later) and the wait on a functional collective's output (DTensor's
``AsyncCollectiveTensor``, which waits inside another op's dispatch, or an explicit
``wait_tensor``). Both are patched at class level; each patch returns its undo.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from .collective_log import CollectiveLog

_C = torch._C._distributed_c10d


def patch_work_wait(log: CollectiveLog) -> Callable[[], None]:
    """Patch ``Work.wait``: add its blocked time to the clock (unless an API wrapper
    that accounts for itself is on the stack) and to the op's record."""
    original = _C.Work.wait
    local, clock = log.local, log.clock

    def wait(work, *a, **k):
        t0 = time.time_ns()
        try:
            return original(work, *a, **k)
        finally:
            dt = time.time_ns() - t0
            try:  # bookkeeping: never replaces what the wait returned or raised
                if not getattr(local, "in_api", False):
                    clock.total_ns += dt
                log.waited_on_work(work, dt)
            except Exception as e:  # noqa: BLE001
                log.note_error(e)

    _C.Work.wait = wait  # type: ignore[assignment]  # a Python wrapper for torch's C method

    def undo() -> None:
        _C.Work.wait = original

    return undo


def patch_async_waits(log: CollectiveLog) -> Callable[[], None]:
    """Patch ``AsyncCollectiveTensor.trigger_wait`` / ``wait`` and the functional
    ``wait_tensor`` entry point to time waits on functional collectives' outputs."""
    from torch.distributed import _functional_collectives as funcol

    act = funcol.AsyncCollectiveTensor
    originals = {"trigger_wait": act.trigger_wait, "wait": act.wait}
    local = log.local

    def timed(name: str):
        original = originals[name]

        def wait(t, *a, **k):
            if (name == "trigger_wait" and t.completed) or getattr(local, "in_wait", False):
                return original(t, *a, **k)
            local.in_wait = True
            t0 = time.time_ns()
            try:
                return original(t, *a, **k)
            finally:
                local.in_wait = False
                _waited(log, t.elem, t0)

        return wait

    for name in originals:
        setattr(act, name, timed(name))
    original_wait_tensor = funcol.wait_tensor

    def wait_tensor(tensor, *a, **k):
        if getattr(local, "in_wait", False):
            return original_wait_tensor(tensor, *a, **k)
        local.in_wait = True
        t0 = time.time_ns()
        try:
            return original_wait_tensor(tensor, *a, **k)
        finally:
            local.in_wait = False
            _waited(log, tensor, t0)

    funcol.wait_tensor = wait_tensor

    def undo() -> None:
        for name, fn in originals.items():
            setattr(act, name, fn)
        funcol.wait_tensor = original_wait_tensor

    return undo


def _waited(log: CollectiveLog, tensor: object, t0: int) -> None:
    """``log.waited_on_tensor`` from a ``finally``: a bookkeeping error is counted, never
    raised over what the wait returned or raised."""
    try:
        log.waited_on_tensor(tensor, t0, time.time_ns())
    except Exception as e:  # noqa: BLE001
        log.note_error(e)
