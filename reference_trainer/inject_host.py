"""Faults of the host and the data path: data-loader stall, CPU contention, NaN output.

- :class:`DataStall` sleeps ``delay_ms`` inside the rank's ``data_wait`` phase, as a slow
  storage read or a starved loader worker would.
- :class:`CpuContention` starts ``procs`` busy processes (``while True: pass``) pinned with
  ``os.sched_setaffinity`` to one core, and pins the rank to the same core, so the rank
  gets about ``1 / (procs + 1)`` of it (Linux CFS shares a core equally between runnable
  processes of equal weight). The core is the ``rank``-th of the rank's allowed cores
  (modulo their count). The busy processes die with the rank (``PR_SET_PDEATHSIG``) and on
  :meth:`CpuContention.close`.
- :class:`NanOutput` multiplies the output of the rank's pipeline stage module by NaN
  (a forward hook), so its receivers, or its own loss on the last stage, turn NaN.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from ranksight.reference_trainer.faults import FaultSpec
from ranksight.reference_trainer.inject_comm import announce
from ranksight.reference_trainer.injector import FaultContext, Injector

_BUSY = "import os, sys\nos.sched_setaffinity(0, {int(sys.argv[1])})\nwhile True:\n    pass\n"
_PR_SET_PDEATHSIG = 1


@dataclass(slots=True)
class DataStall(Injector):
    """Sleeps ``spec.delay_ms`` in every data_wait of active steps."""

    spec: FaultSpec
    injected_s: float = 0.0

    def on_data(self, step: int) -> None:
        """Call inside the data_wait phase of ``step``."""
        if self.spec.active_at(step):
            if self.injected_s == 0.0:
                announce(self.spec, step, f"data loading +{self.spec.delay_ms} ms per step")
            time.sleep(self.spec.delay_s)
            self.injected_s += self.spec.delay_s


def _die_with_parent() -> None:
    """In the child before exec: get SIGKILL when the parent dies (Linux prctl)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


@dataclass(slots=True)
class CpuContention(Injector):
    """Busy processes beside the rank on one core, from ``spec.from_step`` on."""

    spec: FaultSpec
    injected_s: float = 0.0
    core: int | None = None
    """The core the rank and the busy processes share (set when started)."""
    procs: list[subprocess.Popen] = field(default_factory=list)

    def on_step(self, step: int) -> None:
        """Call at the start of every step; starts the contention at ``from_step``."""
        if self.procs or not self.spec.active_at(step):
            return
        cores = sorted(os.sched_getaffinity(0))
        self.core = cores[self.spec.target_rank % len(cores)]
        os.sched_setaffinity(0, {self.core})
        torch.set_num_threads(1)
        for _ in range(self.spec.busy_procs):
            self.procs.append(
                subprocess.Popen(
                    [sys.executable, "-c", _BUSY, str(self.core)],
                    preexec_fn=_die_with_parent,  # noqa: PLW1509 - needed for the death signal
                    stdin=subprocess.DEVNULL,
                )
            )
        pids = [p.pid for p in self.procs]
        announce(self.spec, step, f"core {self.core} shared with busy pids {pids}")

    def close(self) -> None:
        """Stop the busy processes (idempotent)."""
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        self.procs.clear()


@dataclass(slots=True)
class NanOutput(Injector):
    """Turns the stage module's forward output NaN on active steps."""

    spec: FaultSpec
    clock: Any
    """The trainer's StepClock."""
    injected_s: float = 0.0
    _told: bool = False

    @classmethod
    def for_rank(cls, spec: FaultSpec, ctx: FaultContext) -> NanOutput | None:
        return cls(spec=spec, clock=ctx.clock) if spec.rank == ctx.rank else None

    def install_stage(self, stage: Any, module: torch.nn.Module | None) -> None:
        """Register the forward hook on ``module`` (the pipeline stage's module)."""
        if module is not None:
            module.register_forward_hook(self._hook)

    def _hook(self, module: torch.nn.Module, inputs: Any, output: Any) -> Any:
        if not self.spec.active_at(self.clock.step) or not isinstance(output, torch.Tensor):
            return output
        if not self._told:
            announce(self.spec, self.clock.step, "stage output is NaN")
            self._told = True
        return output * float("nan")
