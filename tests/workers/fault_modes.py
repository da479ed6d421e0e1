"""Communication fault modes around the real hooks, on one gloo rank.

Step 0 is clean; from step 1 a ``slow_link`` (group tp, 60 ms) holds every functional
collective of the (one-rank) group; at step 2 a ``desync`` resizes the first all_reduce,
at step 3 another skips it. Each step issues two functional all_reduces in a ``forward``
phase, waited through ``AsyncCollectiveTensor.wait`` and ``trigger_wait``.

Run: python tests/workers/fault_modes.py SPOOL_DIR RUN_ID
"""

import os
import sys

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

from ranksight import trainer_hooks
from ranksight.reference_trainer.fault_runtime import FaultRuntime
from ranksight.reference_trainer.faults import parse_faults
from ranksight.reference_trainer.inject import StepClock

spool, run_id = sys.argv[1], sys.argv[2]
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[3])
dist.init_process_group("gloo", rank=0, world_size=1)
specs = parse_faults(
    [
        "slow_link:rank=0,delay_ms=60,group=tp,from_step=1",
        "desync:rank=0,mode=resize,from_step=2",
        "desync:rank=0,mode=skip,from_step=3",
    ]
)
clock = StepClock()
shape = {"dp": 1, "tp": 1, "pp": 1}
faults = FaultRuntime(specs, rank=0, shape=shape, clock=clock, device=torch.device("cpu"))
faults.enter_below_hooks()
hooks = trainer_hooks.attach(mesh={"dp": 0, "tp": 0, "pp": 0}, spool_dir=spool, run_id=run_id)
faults.enter_above_hooks()
for step in range(4):
    clock.step = step
    with hooks.step(step):
        with hooks.phase("forward"):
            y = funcol.all_reduce(torch.ones(1000), "sum", dist.group.WORLD)
            y = y.wait() if hasattr(y, "wait") else y  # AsyncCollectiveTensor.wait
            z = funcol.all_reduce(torch.ones(500), "sum", dist.group.WORLD)
            z = z + 1  # waits through AsyncCollectiveTensor.trigger_wait
            assert y.shape == (1000,) and float(z[0]) == 2.0
faults.exit_above_hooks()
hooks.close()
faults.close()
print("injected", faults.injected_s)
dist.destroy_process_group()
