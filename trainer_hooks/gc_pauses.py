"""Python garbage-collector pauses, from ``gc.callbacks`` (Python docs, module ``gc``):
the interpreter calls each callback with ``"start"`` and ``"stop"`` around every
collection, with the generation collected. A collection stops the training thread that
triggered it, so long or frequent ones show up as slow steps."""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from typing import Any


class GcRecorder:
    """Emits one ``phases`` record (phase ``gc``, ``microbatch`` = generation) per
    collection inside a training step that lasts at least ``min_ns`` (default 0.1 ms:
    shorter ones cost less to ignore than to record). ``collections`` counts all."""

    def __init__(
        self, emit: Callable[[dict[str, Any]], None], step: Callable[[], int], min_ns: int = 100_000
    ) -> None:
        self._emit, self._step, self._min_ns = emit, step, min_ns
        self._t0 = 0
        self.collections = 0

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._t0 = time.time_ns()
            return
        t1 = time.time_ns()
        self.collections += 1
        step = self._step()
        if step >= 0 and self._t0 and t1 - self._t0 >= self._min_ns:
            self._emit(
                {
                    "t": "phases",
                    "step": step,
                    "phase": "gc",
                    "microbatch": int(info.get("generation", -1)),
                    "stage": -1,
                    "start_ns": self._t0,
                    "end_ns": t1,
                    "wait_ns": 0,
                }
            )

    def install(self) -> Callable[[], None]:
        """Register the callback; returns the undo function."""
        gc.callbacks.append(self._callback)

        def undo() -> None:
            if self._callback in gc.callbacks:
                gc.callbacks.remove(self._callback)

        return undo
