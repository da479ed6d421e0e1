"""Every fault of one rank, installed at the right moment of the trainer's set-up.

Order (``train.build_trainer`` / ``train.train``)::

    faults = FaultRuntime(specs, rank=..., shape=..., clock=..., device=...)
    faults.enter_below_hooks()      # slow_link: a dispatch mode under the hooks'
    hooks = attach_hooks(...)
    ... build the stage ...
    faults.install_stage(stage, module)   # slow, crash, gc_storm, nan, data_stall, ...
    faults.enter_above_hooks()      # desync: wraps funcol.all_reduce over the hooks' wrapper
    hooks.instrument_pipeline_stage(stage)
    for step ...:
        faults.on_step(step)                           # cpu_contention starts
        with phase("data_wait"): faults.on_data(step)  # data_stall
        faults.before_compute(step)                    # hang
    faults.exit_above_hooks(); hooks.close(); faults.close()

What is installed over the hooks is removed before ``hooks.close()`` and what is under
them after it, last first (a dispatch mode's ``__exit__`` pops the top of the mode stack; a
wrapper restores the function it wrapped). Which faults this rank runs, and what each does
at each moment, is the fault kind's injector's (``reference_trainer/injector.py``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from ranksight.reference_trainer.faults import FaultSpec
from ranksight.reference_trainer.injector import FaultContext, Injector, StepClock, build_injectors


@dataclass
class FaultRuntime:
    """The injectors of this rank (most ranks have none), called at each moment."""

    specs: Iterable[FaultSpec]
    rank: int
    shape: dict[str, int]
    """Mesh degrees {"dp", "tp", "pp"}."""
    clock: StepClock
    device: torch.device
    injectors: list[Injector] = field(default_factory=list)
    """Every injector of this rank (each has ``injected_s``), in spec order."""

    def __post_init__(self) -> None:
        self.specs = tuple(self.specs)
        ctx = FaultContext(rank=self.rank, shape=self.shape, clock=self.clock, device=self.device)
        self.injectors = build_injectors(self.specs, ctx)

    def enter_below_hooks(self) -> None:
        """Before the hooks attach: slow links enter their dispatch modes under them."""
        for inj in self.injectors:
            inj.enter_below()

    def install_stage(self, stage: Any, module: torch.nn.Module) -> None:
        """Wrap the stage's compute (slow, crash, gc_storm, gc_pauses), hook its module (nan)."""
        for inj in self.injectors:
            inj.install_stage(stage, module)

    def enter_above_hooks(self) -> None:
        """After the hooks attach: desyncs wrap the functional all_reduce over them."""
        for inj in self.injectors:
            inj.enter_above()

    def on_step(self, step: int) -> None:
        """Call at the start of every step."""
        for inj in self.injectors:
            inj.on_step(step)

    def on_data(self, step: int) -> None:
        """Call inside the data_wait phase."""
        for inj in self.injectors:
            inj.on_data(step)

    def before_compute(self, step: int) -> None:
        """Call after the data_wait phase, before the pipeline schedule."""
        for inj in self.injectors:
            inj.before_compute(step)

    def exit_above_hooks(self) -> None:
        """Undo what is over the hooks (before ``hooks.close()``), last first."""
        for inj in reversed(self.injectors):
            inj.exit_above()

    def close(self) -> None:
        """Undo what is under the hooks (after ``hooks.close()``), last first, and stop
        busy processes. Safe to call twice."""
        for inj in reversed(self.injectors):
            inj.close()

    @property
    def injected_s(self) -> float:
        """Seconds of delay injected on this rank so far."""
        return sum(i.injected_s for i in self.injectors)
