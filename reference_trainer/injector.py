"""The fault seam of the reference trainer: what every injector provides, and how one is
found for a spec.

A fault kind is one entry of ``faults.FAULT_KINDS`` (its keys, its summary and the
``module:Class`` of its injector) and one :class:`Injector` subclass. The trainer's
``FaultRuntime`` builds this rank's injectors (:func:`build_injectors`: each kind's
:meth:`Injector.for_rank` says whether this rank runs it) and calls every injector at
each moment of the set-up and the loop; an injector overrides the moments it acts at.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch

from ranksight.reference_trainer.faults import FAULT_KINDS, FaultSpec

STAGE_COMPUTE_METHODS = ("forward_one_chunk", "backward_one_chunk", "backward_weight_one_chunk")
"""``PipelineStage`` methods that hold one microbatch's compute (1F1B calls the first two)."""


@dataclass(slots=True)
class StepClock:
    """The step the training loop is in (0-based); faults read it to know if they are on."""

    step: int = -1
    """Current step; -1 before the first."""


@dataclass(frozen=True, slots=True)
class FaultContext:
    """What an injector of one rank may need to know."""

    rank: int
    shape: dict[str, int]
    """Mesh degrees {"dp", "tp", "pp"}."""
    clock: StepClock
    device: torch.device

    @property
    def world_size(self) -> int:
        """Ranks of the job: the process group's where it is up, else the mesh's."""
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized():
            return dist.get_world_size()
        return self.shape["dp"] * self.shape["tp"] * self.shape["pp"]


class Injector:
    """One fault on one rank. Each moment below is a no-op unless the kind overrides it;
    ``injected_s`` is the delay injected so far (s)."""

    injected_s: float

    @classmethod
    def for_rank(cls, spec: FaultSpec, ctx: FaultContext) -> Injector | None:
        """This rank's injector for ``spec``, or None where it does not run here. Default:
        built with ``spec`` only, on the spec's rank."""
        return cls(spec=spec) if spec.rank == ctx.rank else None  # type: ignore[call-arg]  # subclasses are dataclasses

    def enter_below(self) -> None:
        """Before the hooks attach (under them: they record what it changes)."""

    def install_stage(self, stage: Any, module: torch.nn.Module | None) -> None:
        """Once the pipeline stage and its module are built, before the hooks instrument it
        (``module``: the stage's module; None where only the stage is wrapped)."""

    def enter_above(self) -> None:
        """After the hooks attach (over them: what it changes is what they see)."""

    def on_step(self, step: int) -> None:
        """At the start of every step."""

    def on_data(self, step: int) -> None:
        """Inside the step's data_wait phase."""

    def before_compute(self, step: int) -> None:
        """After data_wait, before the pipeline schedule runs."""

    def exit_above(self) -> None:
        """Undo :meth:`enter_above` (before the hooks close)."""

    def close(self) -> None:
        """Undo :meth:`enter_below` and stop what it started (after the hooks close)."""


class StageWrapper(Injector):
    """An injector that wraps the stage's compute methods (:data:`STAGE_COMPUTE_METHODS`)
    with :meth:`wrap`."""

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` with the fault applied."""
        raise NotImplementedError

    def install_stage(self, stage: Any, module: torch.nn.Module | None) -> None:
        for name in STAGE_COMPUTE_METHODS:
            if hasattr(stage, name):
                setattr(stage, name, self.wrap(getattr(stage, name)))


@functools.cache
def injector_class(kind: str) -> type[Injector]:
    """The injector class ``FAULT_KINDS[kind]`` names. Raises ValueError for a kind with
    none (``none``) or one that does not name an :class:`Injector`."""
    path = FAULT_KINDS[kind].injector
    module, _, name = path.partition(":")
    cls = getattr(importlib.import_module(module), name, None) if module and name else None
    if not (isinstance(cls, type) and issubclass(cls, Injector)):
        raise ValueError(f"fault kind {kind!r}: {path!r} is not an Injector class")
    return cls


def build_injectors(specs: Iterable[FaultSpec], ctx: FaultContext) -> list[Injector]:
    """This rank's injectors for ``specs``, in spec order (``none`` is no fault)."""
    out = []
    for spec in specs:
        if spec.kind == "none":
            continue
        injector = injector_class(spec.kind).for_rank(spec, ctx)
        if injector is not None:
            out.append(injector)
    return out
