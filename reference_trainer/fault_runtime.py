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
them after it (a dispatch mode's ``__exit__`` pops the top of the mode stack; a wrapper
restores the function it wrapped).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from ranksight.reference_trainer.faults import FaultSpec
from ranksight.reference_trainer.inject import StepClock, install_faults
from ranksight.reference_trainer.inject_comm import Desync, Hang, SlowLink, group_members
from ranksight.reference_trainer.inject_host import CpuContention, DataStall, NanOutput


@dataclass
class FaultRuntime:
    """The injectors of this rank (most ranks have none)."""

    specs: Iterable[FaultSpec]
    rank: int
    shape: dict[str, int]
    """Mesh degrees {"dp", "tp", "pp"}."""
    clock: StepClock
    device: torch.device
    injectors: list[Any] = field(default_factory=list)
    """Every installed injector (each has ``injected_s``)."""
    _below: list[SlowLink] = field(default_factory=list)
    _above: list[Desync] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.specs = tuple(self.specs)

    def _mine(self, *kinds: str) -> list[FaultSpec]:
        return [s for s in self.specs if s.kind in kinds and s.rank == self.rank]

    def enter_below_hooks(self) -> None:
        """Enter the slow-link modes of the groups this rank belongs to (before attach)."""
        for spec in (s for s in self.specs if s.kind == "slow_link"):
            members = group_members(spec, self.shape)
            if self.rank in members:
                mode = SlowLink(spec=spec, clock=self.clock, members=members)
                mode.patch_waits()
                if spec.link_group != "pp":  # pp: the patched waits and posts suffice
                    mode.__enter__()
                    mode.entered = True
                self._below.append(mode)
                self.injectors.append(mode)

    def install_stage(self, stage: Any, module: torch.nn.Module) -> None:
        """Wrap the stage's compute (slow, crash, gc_storm) and hook its module (nan)."""
        self.injectors += install_faults(
            stage, self.specs, rank=self.rank, clock=self.clock, device=self.device
        )
        for spec in self._mine("nan"):
            nan = NanOutput(spec=spec, clock=self.clock)
            nan.install(module)
            self.injectors.append(nan)
        self.injectors += [DataStall(spec=s) for s in self._mine("data_stall")]
        self.injectors += [Hang(spec=s) for s in self._mine("hang")]
        self.injectors += [CpuContention(spec=s) for s in self._mine("cpu_contention")]

    def enter_above_hooks(self) -> None:
        """Wrap the functional all_reduce for this rank's desync faults (after attach)."""
        probe = FaultSpec(kind="slow_link", rank=self.rank, delay_ms=1.0, group="tp")
        for spec in self._mine("desync"):
            desync = Desync(
                spec=spec, clock=self.clock, tp_members=group_members(probe, self.shape)
            )
            desync.install()
            self._above.append(desync)
            self.injectors.append(desync)

    def on_step(self, step: int) -> None:
        """Call at the start of every step."""
        for inj in self.injectors:
            if isinstance(inj, CpuContention):
                inj.on_step(step)

    def on_data(self, step: int) -> None:
        """Call inside the data_wait phase."""
        for inj in self.injectors:
            if isinstance(inj, DataStall):
                inj.on_data(step)

    def before_compute(self, step: int) -> None:
        """Call after the data_wait phase, before the pipeline schedule."""
        for inj in self.injectors:
            if isinstance(inj, Hang):
                inj.before_compute(step)

    def exit_above_hooks(self) -> None:
        """Undo what is over the hooks (before ``hooks.close()``), last first."""
        while self._above:
            self._above.pop().uninstall()

    def close(self) -> None:
        """Leave the modes under the hooks (after ``hooks.close()``), stop busy processes."""
        while self._below:
            mode = self._below.pop()
            if mode.entered:
                mode.__exit__(None, None, None)
            mode.unpatch()
        for inj in self.injectors:
            if isinstance(inj, CpuContention):
                inj.close()

    @property
    def injected_s(self) -> float:
        """Seconds of delay injected on this rank so far."""
        return sum(i.injected_s for i in self.injectors)
