"""DDP's gradient all_reduces, seen and timed, composing with the script's own comm hook.

DDP's reducer all-reduces gradient buckets from C++, where the ``default`` level sees
nothing. :func:`instrument_ddp` registers one comm hook, a :class:`_Route`, on the
model: it calls the stock ``allreduce_hook`` on the model's own process group (what the
reducer would have done) until the script registers a hook of its own, which the route
then calls instead. The script's ``register_comm_hook`` / ``_register_builtin_comm_hook``
keep their meaning: the hook is checked as DDP checks it, a second registration raises
as DDP's does, and the builtin ``ALLREDUCE`` / ``FP16_COMPRESS`` become their Python
twins in ``ddp_comm_hooks.default_hooks`` (same arithmetic). The route's collectives go
through ``torch.distributed``, so the API wrappers (``api_patch.py``) record each bucket.

It also times the wait DDP's reducer does in C++ at the end of backward, for the
buckets, where no Python wait is seen: from the last bucket's hook (this rank's backward
compute is done) to the end of DDP's own end-of-backward callback, measured by a
callback queued behind it. That time is added to the blocked clock, so a fast rank's
wait for a slow peer is a wait (``wait_ns`` of its backward phase), not backward compute.
"""

from __future__ import annotations

import time
import warnings
import weakref
from typing import TYPE_CHECKING, Any

from .collective_log import CollectiveLog

if TYPE_CHECKING:
    from torch.nn.parallel import DistributedDataParallel

_ROUTES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
"""DDP model -> its :class:`_Route` (weak: never keeps a model alive, never pickled)."""
_PATCHED: dict[str, Any] = {}
"""DDP's original ``register_comm_hook`` / ``_register_builtin_comm_hook``, once patched."""


class _Route:
    """The comm hook registered on one DDP model (see the module doc)."""

    def __init__(self, model: Any, log: CollectiveLog) -> None:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        self.log = log
        self.hook, self.state = default_hooks.allreduce_hook, model.process_group
        self.scripts = False
        """The script registered a hook of its own (a second one raises, as in DDP)."""
        self._last, self._queued = 0, False

    def bucket_hook(self, state, bucket):  # noqa: ANN001, ANN201 - DDP checks 'bucket' and its annotation
        """The comm hook: the script's (or the stock all_reduce) on ``bucket``, timed."""
        fut = self.hook(self.state, bucket)
        try:
            self._last = time.time_ns()
            if not self._queued:
                _engine().queue_callback(self._then_finished)
                self._queued = True
        except Exception as e:  # noqa: BLE001 - never break the backward pass
            self.log.note_error(e)
        return fut

    def _then_finished(self) -> None:
        # DDP queues its end-of-backward callback when the last bucket is ready (after
        # this one was queued): a callback queued now runs after it
        _engine().queue_callback(self._finished)

    def _finished(self) -> None:
        self._queued = False
        if self._last:
            self.log.clock.total_ns += max(0, time.time_ns() - self._last)


def _engine() -> Any:
    import torch

    return torch.autograd.Variable._execution_engine


def instrument_ddp(model: Any, log: CollectiveLog | None = None) -> bool:
    """Route ``model``'s gradient buckets through a :class:`_Route` (see the module doc);
    returns whether it did. Raises TypeError if ``model`` is not DistributedDataParallel.
    Without ``log``: the stock all_reduce comm hook only (buckets seen, no blocked time).
    Not routed (False): a model that already has a comm hook (DDP's own
    ``mixed_precision`` registers one; a script's registered before this call), or that
    runs DDP's Python reducer (compiled DDP): their collectives are still seen where
    they go through ``torch.distributed``, without the end-of-backward wait. Twice: no-op.
    """
    from torch.nn.parallel import DistributedDataParallel

    if not isinstance(model, DistributedDataParallel):
        raise TypeError(
            f"instrument_ddp needs a DistributedDataParallel, got {type(model).__name__}"
        )
    if model in _ROUTES:
        return True
    if getattr(model, "_comm_hooks", None) or getattr(model, "_use_python_reducer", False):
        return False
    if log is None:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        model.register_comm_hook(model.process_group, default_hooks.allreduce_hook)
        return True
    _patch_registration(DistributedDataParallel)
    route = _Route(model, log)
    _PATCHED["register_comm_hook"](model, None, route.bucket_hook)
    _ROUTES[model] = route
    return True


def _patch_registration(ddp: type[DistributedDataParallel]) -> None:
    """Make DDP's hook registration methods compose with a route (once per process)."""
    if _PATCHED:
        return
    _PATCHED["register_comm_hook"] = original = ddp.register_comm_hook
    _PATCHED["builtin"] = original_builtin = ddp._register_builtin_comm_hook

    def register_comm_hook(self: Any, state: object, hook: Any) -> None:
        route = _ROUTES.get(self)
        if route is None or route.scripts:  # not ours, or a second hook: DDP decides
            return original(self, state, hook)
        self._check_comm_hook(hook)
        self.logger._set_comm_hook_name(hook.__qualname__)
        self._comm_hooks[:] = [(hook, state)]
        route.hook, route.state, route.scripts = hook, state, True

    def _register_builtin_comm_hook(self: Any, comm_hook_type: Any) -> None:
        twin = _builtin_twin(comm_hook_type)
        route = _ROUTES.get(self)
        if route is None or route.scripts or twin is None:
            return original_builtin(self, comm_hook_type)
        register_comm_hook(self, self.process_group, twin)
        self.logger._set_comm_hook_name(str(comm_hook_type))

    register_comm_hook.__doc__ = original.__doc__
    _register_builtin_comm_hook.__doc__ = original_builtin.__doc__
    ddp.register_comm_hook = register_comm_hook
    ddp._register_builtin_comm_hook = _register_builtin_comm_hook


def _builtin_twin(comm_hook_type: Any) -> Any:
    """The Python comm hook that does what builtin ``comm_hook_type`` does, or None."""
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    twins = {
        dist.BuiltinCommHookType.ALLREDUCE: default_hooks.allreduce_hook,
        dist.BuiltinCommHookType.FP16_COMPRESS: default_hooks.fp16_compress_hook,
    }
    return twins.get(comm_hook_type)


def instrument_on_construction(instrument: Any) -> Any:
    """Wrap ``DistributedDataParallel.__init__`` so every DDP built from now on is passed
    to ``instrument(model)`` (``Hooks.instrument_ddp``; its failure is its own to
    report) right after DDP's constructor, before the script can register a hook.
    Returns the undo function. For zero-code attach (``autoattach.py``)."""
    from torch.nn.parallel import DistributedDataParallel as ddp

    original = ddp.__init__
    if getattr(original, "_ranksight_wrapped", False):
        return lambda: None

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        try:
            instrument(self)
        except Exception as exc:  # noqa: BLE001 - the model trains on, unseen
            warnings.warn(f"ranksight: DDP's buckets not instrumented: {exc}", stacklevel=2)

    __init__.__wrapped__ = original  # type: ignore[attr-defined]
    __init__.__doc__ = original.__doc__
    __init__._ranksight_wrapped = True  # type: ignore[attr-defined]
    ddp.__init__ = __init__

    def undo() -> None:
        ddp.__init__ = original

    return undo
