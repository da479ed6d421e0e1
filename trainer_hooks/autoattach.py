"""Attach the hooks to a training script that does not call them (no code change).

``ranksight launch`` (or anyone) opts a job in with two environment variables::

    RANKSIGHT_AUTO_ATTACH=1
    PYTHONPATH=<this package>/autoload:$PYTHONPATH     # its sitecustomize.py calls install()

In every Python process of the job (a torchrun worker, each process PyTorch Lightning's
own launcher starts, which sets ``LOCAL_RANK``/``WORLD_SIZE`` but no ``RANK``, a
``torch.multiprocessing`` child) :func:`install` waits for
``torch.distributed.distributed_c10d`` to be imported (an import hook: nothing is imported
early, and processes that never use torch.distributed pay nothing), wraps its
``init_process_group`` (which ``init_device_mesh``, Lightning, accelerate and torchtitan
call), and right after the process group exists calls
:func:`ranksight.trainer_hooks.attach`: the rank and world size are the process group's.
From then on every collective and P2P op is recorded as with the two lines (same levels,
same spool, same exit records), and the framework integrations of ``integrations.py``
are installed (every ``DistributedDataParallel`` built is instrumented, composing with
the script's own comm hook). Steps and phases come from ``step_clock.py`` (the optimizer
step hooks, ``DataLoader`` iteration, ``torch.autograd.backward``); the script's own
``hooks.phase`` context managers give exact phases where these do not fit. The default
group's ``destroy_process_group`` (Lightning's and accelerate's end of training calls it
too) closes the hooks: the rank ends ``finished``, as with ``hooks.close()``; called while
an exception propagates, it leaves the ending to the exit records.

Mesh: the trainer's own mesh wins. ``init_device_mesh`` is wrapped too: the DeviceMesh it
returns gives this rank's coordinates and the degrees (``rank_mesh.mesh_coordinates``:
``("dp", "pp", "tp")``, ``("dp_shard", "tp")``, ...); the trainer's own
``ranksight.trainer_hooks.attach(mesh=...)`` wins over both. Until one of them speaks, the
coordinates are a guess and the rank's identity records wait (``rank_mesh.py``): with
``RANKSIGHT_MESH="dp=2,pp=2,tp=2"`` they follow ``ranksight.ground.mesh`` (TP innermost, then PP,
then DP, as ``init_device_mesh(..., ("dp", "pp", "tp"))`` lays ranks out); unset, every
rank is a DP replica (``dp = rank``).

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

from ranksight.ground import env
from ranksight.ground.words import counted

from .integrations import install_integrations
from .step_clock import StepClock

TARGET = "torch.distributed.distributed_c10d"
"""The module whose ``init_process_group`` is wrapped."""
MESH_TARGET = "torch.distributed.device_mesh"
"""The module whose ``init_device_mesh`` is wrapped (imported by ``torch.distributed``
itself, so the wrapper is what ``from torch.distributed import init_device_mesh`` gets)."""
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
    from ranksight.ground.mesh import coords_of

    shape = {"dp": 1, "tp": 1, "pp": 1, **parse_mesh(text)}
    if shape["dp"] * shape["tp"] * shape["pp"] != world_size:
        raise ValueError(
            f"${env.MESH} {text!r} has {counted(shape['dp'] * shape['tp'] * shape['pp'], 'rank')}, "
            f"the job {world_size}"
        )
    return coords_of(rank, shape), shape


def _attach_now() -> None:
    """After ``init_process_group``: attach the hooks, start the step clock, install the
    framework integrations."""
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
    hooks = trainer_hooks.attach(mesh=coords, mesh_shape=shape, meta=meta, mesh_final=False)
    _state["hooks"] = hooks
    if not getattr(hooks, "run_id", ""):
        return  # level off, or attach declined
    clock = StepClock(hooks)
    register_optimizer_step_pre_hook(_guarded(clock.pre))
    register_optimizer_step_post_hook(_guarded(clock.post))
    _state["clock"] = clock
    try:
        _wrap_phases(clock)
    except Exception as exc:  # steps and collectives are still recorded
        warnings.warn(
            f"ranksight auto-attach: no data/forward/backward phases: {exc}", stacklevel=2
        )
    install_integrations(hooks)


def _wrap_phases(clock: StepClock) -> None:
    """Route ``DataLoader`` iteration and ``torch.autograd.backward`` through ``clock``."""
    import torch.autograd
    from torch.utils.data import dataloader

    it = dataloader._BaseDataLoaderIter
    original_next = it.__next__
    if not getattr(original_next, "_ranksight_wrapped", False):

        def __next__(self: Any) -> Any:
            return clock.data_wait(lambda: original_next(self))

        __next__._ranksight_wrapped = True  # type: ignore[attr-defined]
        it.__next__ = __next__
    original_backward = torch.autograd.backward
    if not getattr(original_backward, "_ranksight_wrapped", False):

        def backward(*args: Any, **kwargs: Any) -> Any:
            return clock.backward(lambda: original_backward(*args, **kwargs))

        backward.__wrapped__ = original_backward  # type: ignore[attr-defined]
        backward.__doc__ = original_backward.__doc__
        backward._ranksight_wrapped = True  # type: ignore[attr-defined]
        torch.autograd.backward = backward


def _guarded(fn):
    def call(*args: Any) -> Any:
        try:
            return fn(*args)
        except Exception as exc:  # never break the training step
            warnings.warn(f"ranksight auto-attach: step clock failed: {exc}", stacklevel=2)
            return None

    return call


def _close_on_destroy(group: Any = None) -> None:
    """Before the default group's ``destroy_process_group``: close the hooks (the rank
    finished), unless an exception is propagating (its exit records tell)."""
    hooks = _state["hooks"]
    if hooks is None or group not in (None, _world_group()) or sys.exc_info()[0] is not None:
        return
    clock = _state.pop("clock", None)
    if clock is not None:
        clock.stop()
    if getattr(hooks, "run_id", ""):
        hooks.close()


def _world_group() -> Any:
    from torch.distributed import distributed_c10d as c10d

    return c10d.GroupMember.WORLD


def _wrap(module: Any) -> None:
    """Replace ``module.init_process_group`` by a wrapper that attaches after it, and
    ``module.destroy_process_group`` by one that closes the hooks before it."""
    original = module.init_process_group
    if getattr(original, "_ranksight_wrapped", False):
        return
    _wrap_destroy(module)

    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        out = original(*args, **kwargs)
        try:
            _attach_now()
        except Exception as exc:  # the job runs on without hooks
            warnings.warn(f"ranksight auto-attach failed, recording nothing: {exc}", stacklevel=2)
        return out

    init_process_group.__wrapped__ = original  # type: ignore[attr-defined]
    init_process_group.__doc__ = original.__doc__
    init_process_group._ranksight_wrapped = True  # type: ignore[attr-defined]
    module.init_process_group = init_process_group


def _wrap_device_mesh(module: Any) -> None:
    """Replace ``module.init_device_mesh`` by a wrapper that hands the mesh it returns to
    the hooks (``Hooks.adopt_mesh``, source ``init_device_mesh``)."""
    original = module.init_device_mesh
    if getattr(original, "_ranksight_wrapped", False):
        return

    def init_device_mesh(*args: Any, **kwargs: Any) -> Any:
        mesh = original(*args, **kwargs)
        try:
            _adopt_device_mesh(mesh)
        except Exception as exc:  # the job runs on; the records keep the guess
            warnings.warn(f"ranksight auto-attach: mesh not read: {exc}", stacklevel=2)
        return mesh

    init_device_mesh.__wrapped__ = original  # type: ignore[attr-defined]
    init_device_mesh.__doc__ = original.__doc__
    init_device_mesh._ranksight_wrapped = True  # type: ignore[attr-defined]
    module.init_device_mesh = init_device_mesh


def _adopt_device_mesh(mesh: Any) -> None:
    hooks = _state["hooks"]
    if hooks is None or not getattr(hooks, "run_id", ""):
        return
    import torch.distributed as dist

    from .rank_mesh import mesh_coordinates

    got = mesh_coordinates(mesh, dist.get_world_size())
    if got is not None:
        hooks.adopt_mesh(got[0], got[1], source="init_device_mesh")


_WRAPPERS = {TARGET: _wrap, MESH_TARGET: _wrap_device_mesh}
"""Module name -> what wraps it once it is executed."""


def _wrap_destroy(module: Any) -> None:
    original = module.destroy_process_group

    def destroy_process_group(group: Any = None, *args: Any, **kwargs: Any) -> Any:
        try:
            _close_on_destroy(group)
        except Exception as exc:  # noqa: BLE001 - the group is destroyed regardless
            warnings.warn(f"ranksight auto-attach: close failed: {exc}", stacklevel=2)
        return original(group, *args, **kwargs)

    destroy_process_group.__wrapped__ = original  # type: ignore[attr-defined]
    destroy_process_group.__doc__ = original.__doc__
    module.destroy_process_group = destroy_process_group


class _Finder(importlib.abc.MetaPathFinder):
    """Finds :data:`TARGET` through the other finders and wraps its loader so that
    :func:`_wrap` runs right after the module executes."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname not in _WRAPPERS or fullname in sys.modules:
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
                _WRAPPERS[fullname](module)
            except Exception as exc:
                warnings.warn(
                    f"ranksight auto-attach could not wrap {fullname}: {exc}", stacklevel=2
                )
            finally:
                if all(name in sys.modules for name in _WRAPPERS) and self in sys.meta_path:
                    sys.meta_path.remove(self)

        loader.exec_module = exec_module
        return spec


def install() -> bool:
    """With ``RANKSIGHT_AUTO_ATTACH=1`` and a level other than ``off``: arrange for the
    hooks to attach after ``init_process_group`` (in whichever process calls it: no
    ``RANK`` is needed, see the module doc). Returns whether it did. Safe to call twice."""
    if _state["installed"]:
        return True
    if os.environ.get(env.AUTO_ATTACH) != "1":
        return False
    if os.environ.get(env.LEVEL, "default") == "off":
        return False
    if env.ATTEMPT not in os.environ and os.environ.get("TORCHELASTIC_RESTART_COUNT"):
        os.environ[env.ATTEMPT] = os.environ["TORCHELASTIC_RESTART_COUNT"]
    _state["installed"] = True
    for name, wrap in _WRAPPERS.items():
        if name in sys.modules:
            wrap(sys.modules[name])
    if not all(name in sys.modules for name in _WRAPPERS):
        sys.meta_path.insert(0, _Finder())
    return True
