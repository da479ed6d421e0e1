"""In the training process: time steps, phases and every collective; never block training.

One call attaches them (after ``torch.distributed.init_process_group``)::

    from ranksight import trainer_hooks
    hooks = trainer_hooks.attach(mesh={"dp": dp, "tp": tp, "pp": pp})
"""

from .config import LEVELS, HooksConfig, new_run_id
from .hooks import Hooks, NoopHooks, attach

__all__ = ["LEVELS", "Hooks", "HooksConfig", "NoopHooks", "attach", "new_run_id"]
