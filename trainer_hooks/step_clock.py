"""Steps and phases of a training loop seen from outside it (zero-code attach).

A step ends when the script's optimizer finishes ``step()`` (torch's global optimizer
step hooks; the first optimizer that steps is the clock, so a second optimizer does not
double-count). Phases, from calls every PyTorch training loop makes:

- ``data_wait``: each ``next()`` on a ``DataLoader`` iterator;
- ``backward``: each outermost ``torch.autograd.backward`` call (``loss.backward()``,
  pipelining's stage backward);
- ``forward``: from the end of the last phase boundary (the step's start, a batch's
  arrival, a backward's end) to the next backward's start: the forward pass and whatever
  else the loop does before it (moving the batch, zeroing gradients);
- ``optimizer``: the clock optimizer's ``step()``, less the closure it was given
  (``optimizer.step(closure)``, as PyTorch Lightning and LBFGS drive it): the closure's
  forward and backward are phases of their own, never counted inside the optimizer's.

A collective issued outside every phase the hooks hold open carries the phase the clock
is in: ``forward`` from the step's start or a batch's arrival to the next backward's
start (the forward phase recorded for that span); ``""`` from a backward's end to the
next boundary, a span that is a forward only if another backward follows (gradient
accumulation) and is else the loop's own work before the optimizer (gradient clipping).
"""

from __future__ import annotations

import time
import warnings
from typing import Any


class StepClock:
    """The clock of one rank's hooks (see the module doc): :meth:`pre` / :meth:`post`
    are the optimizer step hooks, :meth:`data_wait` and :meth:`backward` wrap the
    DataLoader's ``next()`` and ``torch.autograd.backward``."""

    def __init__(self, hooks: Any) -> None:
        self.hooks, self.step = hooks, 0
        self.clock_id: int | None = None
        """``id()`` of the optimizer whose steps are the clock (the first that steps)."""
        self._open = hooks.step(0)
        self._open.__enter__()
        self._phase: Any = None
        self._in_backward = False
        self._implicit = ""
        self._mark()
        self._carry_phase(getattr(hooks, "_log", None))

    def _mark(self, implicit: str = "forward") -> None:
        """A phase boundary now: the next forward starts here; collectives issued outside
        any open phase until the next boundary carry ``implicit``."""
        self._since, self._blocked = time.time_ns(), self.hooks.blocked_ns
        self._implicit = implicit

    def _carry_phase(self, log: Any) -> None:
        """Make the collective records of ``log`` (a ``CollectiveLog``: its ``context``
        gives ``(step, phase)``) carry the clock's phase where no phase is open."""
        outer = getattr(log, "context", None)
        if outer is None:
            return

        def context() -> tuple[int, str]:
            step, phase = outer()
            return step, phase or (self._implicit if self._open is not None else "")

        log.context = context

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
            self._mark(implicit="")

    def _enter_optimizer(self) -> None:
        self._phase = self.hooks.phase("optimizer")
        self._phase.__enter__()

    def _leave_optimizer(self) -> None:
        if self._phase is not None:
            phase, self._phase = self._phase, None
            phase.__exit__(None, None, None)

    def pre(self, optimizer: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
        """Optimizer step pre-hook (``args`` start with the optimizer itself): opens the
        optimizer phase, or, given a closure, returns the arguments with the closure
        wrapped so that the phase opens only once the closure has run."""
        if self.clock_id is None:
            self.clock_id = id(optimizer)
        if id(optimizer) != self.clock_id or self._open is None:
            return None
        if "closure" in kwargs and callable(kwargs["closure"]):
            return args, {**kwargs, "closure": self._around(kwargs["closure"])}
        if len(args) > 1 and callable(args[1]):
            return (args[0], self._around(args[1]), *args[2:]), kwargs
        self._enter_optimizer()
        return None

    def _around(self, closure: Any) -> Any:
        """``closure`` run outside the optimizer phase (which restarts after each call:
        LBFGS calls it several times)."""

        def closure_outside_optimizer(*a: Any, **k: Any) -> Any:
            self._leave_optimizer()
            try:
                return closure(*a, **k)
            finally:
                try:
                    self._enter_optimizer()
                except Exception as exc:  # noqa: BLE001 - the step goes on untimed
                    warnings.warn(f"ranksight auto-attach: optimizer phase: {exc}", stacklevel=2)

        return closure_outside_optimizer

    def post(self, optimizer: Any, *_: Any) -> None:
        """Optimizer step post-hook: closes the optimizer phase and the step, opens the
        next step."""
        if id(optimizer) != self.clock_id or self._open is None:
            return
        self._leave_optimizer()
        self._open.__exit__(None, None, None)
        self.step += 1
        self._open = self.hooks.step(self.step)
        self._open.__enter__()
        self._mark()

    def stop(self) -> None:
        """No more steps: the open step is dropped (it never ended)."""
        self._phase = self._open = None
