"""``slow_turns``: one rank's compute slow for one step, a different rank each time.

What long sequences or a hot expert do when they land on a different rank every few
steps: on its turn (``FaultSpec.paused_rank``: every ``every`` steps from ``from_step``,
ranks 0, 3, 6, ... modulo the world size), the rank's forward and backward of that step
take ``factor`` times as long. No rank is slow for long, so no chronic straggler is
there to name: the analyzer should report a transient straggler with compute as its
cause (``analyzer/detectors/transient.py``).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ranksight.reference_trainer.faults import FaultSpec
from ranksight.reference_trainer.inject_comm import announce
from ranksight.reference_trainer.injector import FaultContext, StageWrapper, StepClock


@dataclass(slots=True)
class SlowTurns(StageWrapper):
    """On this rank's turns, every wrapped compute call of the step is stretched to
    ``spec.factor`` times its duration (a sleep after it, as ``slow`` does)."""

    spec: FaultSpec
    """The ``slow_turns`` spec (it names no rank: every rank takes turns)."""
    clock: StepClock
    """Shared with the training loop."""
    rank: int
    world_size: int
    injected_s: float = 0.0
    """Total seconds slept on this rank's turns."""
    _told: int = -1

    @classmethod
    def for_rank(cls, spec: FaultSpec, ctx: FaultContext) -> SlowTurns:
        """Every rank: each takes its turns."""
        return cls(spec=spec, clock=ctx.clock, rank=ctx.rank, world_size=ctx.world_size)

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` made ``factor`` times slower in the steps that are this rank's turn."""

        @functools.wraps(fn)
        def slowed(*args: Any, **kwargs: Any) -> Any:
            step = self.clock.step
            if self.spec.paused_rank(step, self.world_size) != self.rank:
                return fn(*args, **kwargs)
            start = time.perf_counter()
            out = fn(*args, **kwargs)
            delay = (self.spec.slow_factor - 1.0) * (time.perf_counter() - start)
            if self._told != step:
                self._told = step
                announce(self.spec, step, f"rank {self.rank} compute x{self.spec.factor}")
            time.sleep(delay)
            self.injected_s += delay
            return out

        return slowed
