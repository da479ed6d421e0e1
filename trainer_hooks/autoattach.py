"""Attach the hooks to a training script that does not call them (no code change).

``ranksight launch`` (or anyone) opts a job in with two environment variables::

    RANKSIGHT_AUTO_ATTACH=1
    PYTHONPATH=<this package>/autoload:$PYTHONPATH     # its sitecustomize.py calls install()

In each torchrun worker (``RANK`` is set) :func:`install` waits for
``torch.distributed.distributed_c10d`` to be imported (an import hook: nothing is imported
early, and processes that never use torch.distributed pay nothing), wraps its
``init_process_group`` (which ``init_device_mesh`` calls too), and right after the process
group exists calls :func:`ranksight.trainer_hooks.attach`. From then on every collective
and P2P op is recorded as with the two lines (same levels, same spool, same exit records).

Steps without code: a training step ends when the script's optimizer finishes
``step()`` (torch's global optimizer step hooks; the first optimizer that steps is the
clock, so a second optimizer does not double-count). Step 0 starts when the process group
is made, so it includes set-up. Phases without code, from three calls every PyTorch
training loop makes:

- ``data_wait``: each ``next()`` on a ``DataLoader`` iterator;
- ``backward``: each outermost ``torch.autograd.backward`` call (``loss.backward()``,
  pipelining's stage backward);
- ``forward``: from the end of the last of these boundaries (the step's start, a batch's
  arrival, a backward's end) to the next backward's start: the forward pass and whatever
  else the loop does before it (moving the batch, zeroing gradients);
- ``optimizer``: the clock optimizer's ``step()``.

On a GPU these are host times, like the hooks' own phases. The script's own
``hooks.phase`` context managers give exact phases where these do not fit.

Mesh: ``RANKSIGHT_MESH="dp=2,pp=2,tp=2"`` gives the mesh shape; each rank's coordinates
follow ``ranksight.reference_trainer.layout`` (TP innermost, then PP, then DP, as
``init_device_mesh(..., ("dp", "pp", "tp"))`` lays ranks out). Unset: every rank is a DP
replica (``dp = rank``).

Nothing here may break the job: every failure is a warning and the script runs on.
A restarted worker (torchrun ``--max-restarts``) records under attempt
``TORCHELASTIC_RESTART_COUNT`` unless ``RANKSIGHT_ATTEMPT`` is set.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
import time
import warnings
from typing import Any

from ranksight import env
from ranksight.words import counted

TARGET = "torch.distributed.distributed_c10d"
"""The module whose ``init_process_group`` is wrapped."""
AUTOLOAD_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "autoload")
"""The folder to put first on ``PYTHONPATH``: it holds the ``sitecustomize.py`` that calls
:func:`install`."""

_state: dict[str, Any] = {"installed": False, "hooks": None}


def parse_mesh(text: str, where: str = f"${env.MESH}") -> dict[str, int]:
    """``"dp=2,pp=2,tp=2"`` -> ``{"dp": 2, "pp": 2, "tp": 2}``. Raises ValueError naming
    ``where`` the text came from (``$RANKSIGHT_MESH``, a flag) and what is wrong (unknown
    axis, not a positive integer)."""
    shape: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, value = part.partition("=")
        if name not in ("dp", "tp", "pp") or not value.isdigit() or int(value) < 1:
            raise ValueError(
                f"{where} {text!r}: want axis=size pairs like dp=2,pp=2,tp=2 "
                f"(axes dp, tp, pp; sizes >= 1), got {part!r}"
            )
        shape[name] = int(value)
    return shape


def mesh_of(rank: int, world_size: int, text: str | None) -> tuple[dict[str, int], dict[str, int]]:
    """``(coords, shape)`` of ``rank`` for the mesh spec ``text`` (see the module doc).
    Raises ValueError if the mesh's size is not ``world_size``."""
    if not text:
        return {"dp": rank, "tp": 0, "pp": 0}, {"dp": world_size, "tp": 1, "pp": 1}
    from ranksight.reference_trainer.layout import coords_of

    shape = {"dp": 1, "tp": 1, "pp": 1, **parse_mesh(text)}
    if shape["dp"] * shape["tp"] * shape["pp"] != world_size:
        raise ValueError(
            f"${env.MESH} {text!r} has {counted(shape['dp'] * shape['tp'] * shape['pp'], 'rank')}, "
            f"the job {world_size}"
        )
    return coords_of(rank, shape), shape


class _StepClock:
    """Steps and phases from outside the script (see the module doc): the optimizer step
    hooks end steps; :meth:`data_wait` and :meth:`backward` wrap the DataLoader's
    ``next()`` and ``torch.autograd.backward``; the forward phase is what lies between."""

    def __init__(self, hooks: Any) -> None:
        self.hooks, self.step, self.clock_id = hooks, 0, None
        self._open = hooks.step(0)
        self._open.__enter__()
        self._phase = None
        self._in_backward = False
        self._mark()

    def _mark(self) -> None:
        """A phase boundary now: the next forward starts here."""
        self._since, self._blocked = time.time_ns(), self.hooks.blocked_ns

    def data_wait(self, next_batch: Any) -> Any:
        """Call ``next_batch()`` as the ``data_wait`` phase."""
        if self._open is None:
            return next_batch()
        with self.hooks.phase("data_wait"):
            try:
                return next_batch()
            finally:
                self._mark()

    def backward(self, run: Any) -> Any:
        """Call ``run()`` (a backward pass) as the ``backward`` phase, after recording the
        forward phase that led to it. Nested backward calls are part of the outer one."""
        if self._open is None or self._in_backward:
            return run()
        try:
            now = time.time_ns()
            if now > self._since:
                self.hooks.record_phase("forward", self._since, now,
                                        self.hooks.blocked_ns - self._blocked)  # fmt: skip
        except Exception as exc:  # noqa: BLE001 - never break the training step
            warnings.warn(f"ranksight auto-attach: forward phase failed: {exc}", stacklevel=3)
        self._in_backward = True
        try:
            with self.hooks.phase("backward"):
                return run()
        finally:
            self._in_backward = False
            self._mark()

    def pre(self, optimizer: Any, *_: Any) -> None:
        if self.clock_id is None:
            self.clock_id = id(optimizer)
        if id(optimizer) == self.clock_id and self._open is not None:
            self._phase = self.hooks.phase("optimizer")
            self._phase.__enter__()

    def post(self, optimizer: Any, *_: Any) -> None:
        if id(optimizer) != self.clock_id or self._open is None:
            return
        if self._phase is not None:
            self._phase.__exit__(None, None, None)
            self._phase = None
        self._open.__exit__(None, None, None)
        self.step += 1
        self._open = self.hooks.step(self.step)
        self._open.__enter__()
        self._mark()


def _attach_now() -> None:
    """After ``init_process_group``: attach the hooks and start the step clock."""
    if _state["hooks"] is not None:
        return
    import torch.distributed as dist
    from torch.optim.optimizer import (
        register_optimizer_step_post_hook,
        register_optimizer_step_pre_hook,
    )

    from ranksight import trainer_hooks

    rank, world = dist.get_rank(), dist.get_world_size()
    coords, shape = mesh_of(rank, world, os.environ.get(env.MESH))
    meta = {"attached": "auto", "argv": sys.argv, "started_ns": time.time_ns()}
    hooks = trainer_hooks.attach(mesh=coords, mesh_shape=shape, meta=meta)
    _state["hooks"] = hooks
    if not getattr(hooks, "run_id", ""):
        return  # level off, or attach declined
    clock = _StepClock(hooks)
    register_optimizer_step_pre_hook(_guarded(clock.pre))
    register_optimizer_step_post_hook(_guarded(clock.post))
    _state["clock"] = clock
    try:
        _wrap_phases(clock)
    except Exception as exc:  # steps and collectives are still recorded
        warnings.warn(
            f"ranksight auto-attach: no data/forward/backward phases: {exc}", stacklevel=2
        )


def _wrap_phases(clock: _StepClock) -> None:
    """Route ``DataLoader`` iteration and ``torch.autograd.backward`` through ``clock``."""
    import torch.autograd
    from torch.utils.data import dataloader

    it = dataloader._BaseDataLoaderIter
    original_next = it.__next__
    if not getattr(original_next, "_ranksight_wrapped", False):

        def __next__(self: Any) -> Any:
            return clock.data_wait(lambda: original_next(self))

        __next__._ranksight_wrapped = True
        it.__next__ = __next__
    original_backward = torch.autograd.backward
    if not getattr(original_backward, "_ranksight_wrapped", False):

        def backward(*args: Any, **kwargs: Any) -> Any:
            return clock.backward(lambda: original_backward(*args, **kwargs))

        backward.__wrapped__ = original_backward
        backward.__doc__ = original_backward.__doc__
        backward._ranksight_wrapped = True
        torch.autograd.backward = backward


def _guarded(fn):
    def call(*args: Any) -> None:
        try:
            fn(*args)
        except Exception as exc:  # never break the training step
            warnings.warn(f"ranksight auto-attach: step clock failed: {exc}", stacklevel=2)

    return call


def _wrap(module: Any) -> None:
    """Replace ``module.init_process_group`` by a wrapper that attaches after it."""
    original = module.init_process_group
    if getattr(original, "_ranksight_wrapped", False):
        return

    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        out = original(*args, **kwargs)
        try:
            _attach_now()
        except Exception as exc:  # the job runs on without hooks
            warnings.warn(f"ranksight auto-attach failed, recording nothing: {exc}", stacklevel=2)
        return out

    init_process_group.__wrapped__ = original
    init_process_group.__doc__ = original.__doc__
    init_process_group._ranksight_wrapped = True
    module.init_process_group = init_process_group


class _Finder(importlib.abc.MetaPathFinder):
    """Finds :data:`TARGET` through the other finders and wraps its loader so that
    :func:`_wrap` runs right after the module executes."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != TARGET:
            return None
        sys.meta_path.remove(self)  # find the real spec with the other finders
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return None
        loader = spec.loader
        real_exec = loader.exec_module

        def exec_module(module: Any) -> None:
            real_exec(module)
            try:
                _wrap(module)
            except Exception as exc:
                warnings.warn(f"ranksight auto-attach could not wrap {TARGET}: {exc}", stacklevel=2)
            finally:
                if self in sys.meta_path:
                    sys.meta_path.remove(self)

        loader.exec_module = exec_module
        return spec


def install() -> bool:
    """In a torchrun worker with ``RANKSIGHT_AUTO_ATTACH=1`` and a level other than
    ``off``: arrange for the hooks to attach after ``init_process_group``. Returns whether
    it did. Safe to call twice."""
    if _state["installed"]:
        return True
    if os.environ.get(env.AUTO_ATTACH) != "1" or os.environ.get("RANK") is None:
        return False
    if os.environ.get(env.LEVEL, "default") == "off":
        return False
    if env.ATTEMPT not in os.environ and os.environ.get("TORCHELASTIC_RESTART_COUNT"):
        os.environ[env.ATTEMPT] = os.environ["TORCHELASTIC_RESTART_COUNT"]
    _state["installed"] = True
    loaded = sys.modules.get(TARGET)
    if loaded is not None:
        _wrap(loaded)
    else:
        sys.meta_path.insert(0, _Finder())
    return True
