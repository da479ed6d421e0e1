"""Framework integrations of zero-code attach, registered in one place.

Each entry is ``name -> install(hooks) -> undo``, called once right after the hooks attach
(``autoattach.py``). What the frameworks need beyond the process group wrap, the
collective wrappers and the step clock (``step_clock.py``):

- ``ddp``: every ``DistributedDataParallel`` built (by the script, PyTorch Lightning's
  ``ddp`` strategy, accelerate / the Hugging Face Trainer) is instrumented right after its
  constructor (``ddp.py``): its gradient buckets are recorded and the end-of-backward
  wait is blocked time, composing with a comm hook the script or framework registers.

What needs no entry: Lightning's own launcher (each process it starts calls
``init_process_group``), Lightning's ``optimizer.step(closure)`` (the step clock keeps
the closure outside the optimizer phase), FSDP2, DTensor and pipelining (their
collectives go through the wrapped ``torch.distributed`` functions). Nothing here is
imported before the hooks attach.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any


def _ddp(hooks: Any) -> Callable[[], None]:
    from .ddp import instrument_on_construction

    return instrument_on_construction(hooks.instrument_ddp)


INTEGRATIONS: dict[str, Callable[[Any], Callable[[], None]]] = {"ddp": _ddp}
"""Every integration, by name."""


def install_integrations(hooks: Any) -> list[Callable[[], None]]:
    """Install every integration of :data:`INTEGRATIONS` for ``hooks``; returns their undo
    functions. One that fails is a warning, the others are installed."""
    undo = []
    for name, install in INTEGRATIONS.items():
        try:
            undo.append(install(hooks))
        except Exception as exc:  # noqa: BLE001 - the job runs on without it
            warnings.warn(f"ranksight auto-attach: no {name} integration: {exc}", stacklevel=2)
    return undo
