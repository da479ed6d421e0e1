"""Apply fault specs to a running rank.

Where the ``slow`` fault sits, and why
--------------------------------------
``Schedule1F1B._step_microbatches`` (torch/distributed/pipelining/schedules.py, torch 2.13)
waits for every P2P receive (``_wait_batch_p2p``) *before* it calls

    stage.forward_one_chunk(fwd_chunk_id, args, kwargs, save_forward_output=...)
    stage.backward_one_chunk(bwd_chunk_id, loss=..., last_backward=...)

and fires the sends after they return; the DP gradient reduction runs later still, in
``stage.perform_reduce_grad``. So these two calls hold the stage's compute and the TP
all_reduces inside it, and no pipeline or DP communication. :func:`install_faults` replaces
them on the stage *instance* with wrappers that time the call and then sleep ``(factor - 1)``
times that duration: the rank's microbatch compute takes ``factor`` times as long, the rank
releases the CPU while "computing" (8 ranks share 2 cores), and its own send/recv and
collectives are not lengthened; its TP peers, pipeline neighbours and DP peers wait for it.
On CUDA the wrapper synchronises before and after timing the call, so it measures device
time and the sleep delays every later kernel. The timed call includes this rank's in-chunk
TP all_reduces; as the late arriver, its wait in them is short.

The trainer installs these wrappers first and lets ``hooks.instrument_pipeline_stage`` wrap
outside them, so the hooks' per-microbatch forward/backward timing includes the delay.
``crash`` (exit in the first call of ``from_step``) and ``gc_storm`` (allocation churn and
``gc.collect()`` before every call) use the same seam. The other kinds live in
:mod:`~ranksight.reference_trainer.inject_comm` (slow link, hang, desync) and
:mod:`~ranksight.reference_trainer.inject_host` (data stall, CPU contention, NaN), and
:class:`~ranksight.reference_trainer.fault_runtime.FaultRuntime` installs them all.
"""

from __future__ import annotations

import functools
import gc
import os
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch

from ranksight.reference_trainer.faults import FaultSpec
from ranksight.reference_trainer.inject_comm import announce
from ranksight.reference_trainer.injector import (
    STAGE_COMPUTE_METHODS,
    FaultContext,
    Injector,
    StageWrapper,
    StepClock,
    build_injectors,
)

__all__ = ["STAGE_COMPUTE_METHODS", "StepClock"]  # kept here for the trainer and its tests


@dataclass(slots=True)
class SlowCompute(StageWrapper):
    """Stretches every wrapped call on this rank to ``spec.factor`` times its duration."""

    spec: FaultSpec
    """The ``slow`` spec, whose rank is this rank."""
    clock: StepClock
    """Shared with the training loop."""
    device: torch.device
    """Synchronised around the timed call when it is a CUDA device."""
    injected_s: float = 0.0
    """Total seconds slept so far (the injected delay, for the summary)."""

    @classmethod
    def for_rank(cls, spec: FaultSpec, ctx: FaultContext) -> SlowCompute | None:
        return cls(spec=spec, clock=ctx.clock, device=ctx.device) if spec.rank == ctx.rank else None

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` made ``factor`` times slower while the fault is active."""

        @functools.wraps(fn)
        def slowed(*args: Any, **kwargs: Any) -> Any:
            if not self.spec.active_at(self.clock.step):
                return fn(*args, **kwargs)
            self._sync()
            start = time.perf_counter()
            out = fn(*args, **kwargs)
            self._sync()
            delay = (self.spec.slow_factor - 1.0) * (time.perf_counter() - start)
            if self.injected_s == 0.0:
                announce(self.spec, self.clock.step, f"compute x{self.spec.factor}")
            time.sleep(delay)
            self.injected_s += delay
            return out

        return slowed


CRASH_EXIT_CODE = 17
"""Exit status of a rank killed by the ``crash`` fault."""


@dataclass(slots=True)
class Crash(StageWrapper):
    """Ends this rank's process abruptly (``os._exit``, no clean-up, like a segfault or an
    OOM kill) at the first wrapped call once the fault is active."""

    spec: FaultSpec
    """The ``crash`` spec, whose rank is this rank."""
    clock: StepClock
    """Shared with the training loop."""
    injected_s: float = 0.0
    """Always 0 (kept for the summary's uniform shape)."""

    @classmethod
    def for_rank(cls, spec: FaultSpec, ctx: FaultContext) -> Crash | None:
        return cls(spec=spec, clock=ctx.clock) if spec.rank == ctx.rank else None

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` that kills the process instead once the fault is active."""

        @functools.wraps(fn)
        def crashing(*args: Any, **kwargs: Any) -> Any:
            if self.spec.active_at(self.clock.step):
                print(
                    f"fault injected: crash at step {self.clock.step}", file=sys.stderr, flush=True
                )
                announce(self.spec, self.clock.step, f"exit {CRASH_EXIT_CODE}")
                os._exit(CRASH_EXIT_CODE)
            return fn(*args, **kwargs)

        return crashing


GC_STORM_OBJECTS = 100_000
"""Objects in one reference cycle a ``gc_storm`` allocates and collects per call (about
0.05 s of allocation and ``gc.collect()`` in a bare interpreter on a 2-core VM; more in a
process holding many objects, since a full collection walks them all)."""


@dataclass(slots=True)
class GcStorm(StageWrapper):
    """Allocation churn and a full ``gc.collect()`` before every wrapped call once active:
    the Python garbage collector's pauses land inside the rank's forward/backward."""

    spec: FaultSpec
    """The ``gc_storm`` spec, whose rank is this rank."""
    clock: StepClock
    """Shared with the training loop."""
    injected_s: float = 0.0
    """Total seconds spent in churn and collections."""

    @classmethod
    def for_rank(cls, spec: FaultSpec, ctx: FaultContext) -> GcStorm | None:
        return cls(spec=spec, clock=ctx.clock) if spec.rank == ctx.rank else None

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` preceded by a garbage storm while the fault is active."""

        @functools.wraps(fn)
        def stormy(*args: Any, **kwargs: Any) -> Any:
            if self.spec.active_at(self.clock.step):
                if self.injected_s == 0.0:
                    announce(self.spec, self.clock.step, "gc.collect() per microbatch")
                start = time.perf_counter()
                garbage: list[list[object]] = [[] for _ in range(GC_STORM_OBJECTS)]
                for i in range(GC_STORM_OBJECTS):  # one big reference cycle
                    garbage[i].append(garbage[i - 1])
                del garbage
                gc.collect()
                self.injected_s += time.perf_counter() - start
            return fn(*args, **kwargs)

        return stormy


@dataclass(slots=True)
class GcPauses(StageWrapper):
    """On this rank's turns (``FaultSpec.paused_rank``), one garbage collection in its
    first compute call of the step that lasts ``delay_ms``: the collection is real
    (``gc.collect()``), and a ``gc.callbacks`` entry added after every other holds it in its
    start phase for the rest of the time, so whatever times GC pauses (the hooks'
    ``gc.callbacks`` recorder) sees one pause of that length, as a large heap's would be."""

    spec: FaultSpec
    """The ``gc_pauses`` spec (it names no rank: every rank takes turns)."""
    clock: StepClock
    """Shared with the training loop."""
    rank: int
    """This rank."""
    world_size: int
    """Ranks taking turns."""
    injected_s: float = 0.0
    """Total seconds of injected pauses on this rank."""
    _last: int = -1

    @classmethod
    def for_rank(cls, spec: FaultSpec, ctx: FaultContext) -> GcPauses:
        """Every rank: each takes its turns (``FaultSpec.paused_rank``)."""
        return cls(spec=spec, clock=ctx.clock, rank=ctx.rank, world_size=ctx.world_size)

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` preceded, on this rank's turn, by one long garbage collection."""

        @functools.wraps(fn)
        def paused(*args: Any, **kwargs: Any) -> Any:
            step = self.clock.step
            if step != self._last and self.spec.paused_rank(step, self.world_size) == self.rank:
                self._last = step
                self._pause(step)
            return fn(*args, **kwargs)

        return paused

    def _pause(self, step: int) -> None:
        seconds = (self.spec.delay_ms or 0.0) / 1e3
        start = time.perf_counter()

        def hold(phase: str, info: dict) -> None:
            if phase == "start":
                time.sleep(max(0.0, seconds - (time.perf_counter() - start)))

        announce(self.spec, step, f"gc pause {seconds:.2f} s on rank {self.rank}")
        gc.callbacks.append(hold)
        try:
            gc.collect()
        finally:
            gc.callbacks.remove(hold)
        self.injected_s += time.perf_counter() - start


def install_faults(
    stage: Any, specs: Iterable[FaultSpec], *, rank: int, clock: StepClock, device: torch.device
) -> list[Injector]:
    """Wrap ``stage``'s compute methods with every fault in ``specs`` whose injector wraps
    the stage compute (``slow``, ``crash``, ``gc_storm`` on ``rank``; ``gc_pauses`` on
    every rank); the others are left to ``FaultRuntime``. Call before
    ``hooks.instrument_pipeline_stage(stage)``. Returns the installed injectors."""
    ctx = FaultContext(rank=rank, shape={"dp": 1, "tp": 1, "pp": 1}, clock=clock, device=device)
    wrappers = [i for i in build_injectors(specs, ctx) if isinstance(i, StageWrapper)]
    for injector in wrappers:
        injector.install_stage(stage, None)
    return list(wrappers)
