"""In the training process: time steps, phases and every collective; never block training.

One call attaches them (after ``torch.distributed.init_process_group``)::

    from ranksight import trainer_hooks
    hooks = trainer_hooks.attach(mesh={"dp": dp, "tp": tp, "pp": pp})

``Hooks``, ``NoopHooks`` and ``attach`` are loaded on first use, so that the node agent,
which only reads the spool format (``trainer_hooks.spool``), does not import torch.
"""

from typing import Any

from .config import LEVELS, HooksConfig, new_run_id

__all__ = ["LEVELS", "Hooks", "HooksConfig", "NoopHooks", "attach", "new_run_id"]


def __getattr__(name: str) -> Any:
    if name in ("Hooks", "NoopHooks", "attach"):
        from . import hooks

        return getattr(hooks, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
