"""The one place the trainer meets ``ranksight.trainer_hooks``.

The trainer only uses the hooks' public surface (:class:`TrainerHooks`). When hooks are off,
or ``ranksight.trainer_hooks`` has no ``attach`` yet, it gets :class:`NoopHooks`, which has
the same methods and does nothing, so the training loop has no ``if hooks:`` branches.
"""

from __future__ import annotations

import contextlib
import os
import sys
import uuid
from collections.abc import Iterator, Mapping
from typing import Any, Protocol

from ranksight.ground import env


class StepRecord(Protocol):
    """What ``hooks.step(n)`` yields: the step's own numbers."""

    def set(self, **fields: Any) -> None:
        """Attach fields such as loss (float or None), tokens (int), lr (float)."""


class TrainerHooks(Protocol):
    """The surface of ``ranksight.trainer_hooks.attach(...)``'s return value."""

    def instrument_pipeline_stage(self, stage: Any) -> Any:
        """Wrap ``stage.forward_one_chunk`` / ``backward_one_chunk`` to time microbatches."""

    def step(self, step: int) -> contextlib.AbstractContextManager[StepRecord]:
        """Time one training step (1-based)."""

    def phase(self, name: str) -> contextlib.AbstractContextManager[None]:
        """Time one phase (``data_wait``, ``optimizer``, ...) inside the current step."""

    def close(self) -> None:
        """Flush and detach."""


class _NoopStep:
    def set(self, **fields: Any) -> None:
        pass


class NoopHooks:
    """Hooks that record nothing; same methods as :class:`TrainerHooks`."""

    def instrument_pipeline_stage(self, stage: Any) -> Any:
        return stage

    @contextlib.contextmanager
    def step(self, step: int) -> Iterator[StepRecord]:
        yield _NoopStep()

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        yield

    def close(self) -> None:
        pass


def attach_hooks(
    *,
    level: str,
    run_id: str | None,
    mesh: Mapping[str, int],
    mesh_shape: Mapping[str, int],
    meta: Mapping[str, Any],
) -> TrainerHooks:
    """Attach ``ranksight.trainer_hooks`` at ``level`` (``off`` gives :class:`NoopHooks`).

    Call after ``init_process_group``, on every rank (it runs one broadcast). ``level`` and
    ``run_id`` are explicit arguments, so they override RANKSIGHT_LEVEL / RANKSIGHT_RUN_ID
    for the hooks, which read the environment. ``mesh`` is this rank's {"dp", "tp", "pp"}
    coordinates, ``mesh_shape`` the degrees, ``meta`` the run's config and fault ground
    truth.
    """
    if level == "off":
        return NoopHooks()
    os.environ[env.LEVEL] = level
    os.environ[env.RUN_ID] = shared_run_id(run_id)
    try:
        from ranksight.trainer_hooks import attach
    except ImportError as err:
        print(f"ranksight: trainer_hooks unavailable ({err}); hooks off", file=sys.stderr)
        return NoopHooks()
    return attach(mesh=dict(mesh), mesh_shape=dict(mesh_shape), meta=dict(meta))


def shared_run_id(run_id: str | None) -> str:
    """One run id for all ranks: ``run_id``, else RANKSIGHT_RUN_ID, else one made up.

    Rank 0's choice is broadcast, so ranks never disagree (a run id made up on each rank,
    or an environment variable set on one node only, would split the run). A made-up id is
    ``run-`` + torchrun's TORCHELASTIC_RUN_ID when set, else ``run-`` + 12 random hex digits.
    """
    import torch.distributed as dist

    chosen = run_id or os.environ.get(env.RUN_ID)
    if not chosen:
        elastic = os.environ.get("TORCHELASTIC_RUN_ID", "")
        chosen = "run-" + (elastic if elastic and elastic != "none" else uuid.uuid4().hex[:12])
    if not (dist.is_available() and dist.is_initialized()):
        return chosen
    box = [chosen]
    dist.broadcast_object_list(box, src=0)
    return str(box[0])
