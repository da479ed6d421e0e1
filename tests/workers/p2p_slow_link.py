"""A slow pipeline link on 2 gloo ranks with the real hooks: rank 0 sends to rank 1 three
times per step; from step 1 ``slow_link:rank=0,group=pp`` makes rank 1's recvs from rank 0
complete 80 ms late, while rank 0 sends on time and goes on.

Run: torchrun --nproc-per-node 2 tests/workers/p2p_slow_link.py SPOOL_DIR RUN_ID
"""

import sys
import time

import torch
import torch.distributed as dist

from ranksight import trainer_hooks
from ranksight.reference_trainer.fault_runtime import FaultRuntime
from ranksight.reference_trainer.faults import parse_faults
from ranksight.reference_trainer.inject import StepClock

spool, run_id = sys.argv[1], sys.argv[2]
dist.init_process_group("gloo")
rank = dist.get_rank()
clock = StepClock()
specs = parse_faults(["slow_link:rank=0,delay_ms=80,group=pp,from_step=1"])
shape = {"dp": 1, "tp": 1, "pp": 2}
faults = FaultRuntime(specs, rank=rank, shape=shape, clock=clock, device=torch.device("cpu"))
faults.enter_below_hooks()
hooks = trainer_hooks.attach(
    mesh={"dp": 0, "tp": 0, "pp": rank}, mesh_shape=shape, spool_dir=spool, run_id=run_id
)
dist.barrier()  # both ranks start step 0 together: attach takes longer on one of them
for step in range(3):
    clock.step = step
    with hooks.step(step):
        for _ in range(3):
            x = torch.ones(256)
            op = dist.P2POp(dist.isend if rank == 0 else dist.irecv, x, 1 - rank)
            for work in dist.batch_isend_irecv([op]):
                work.wait()
    if rank == 0:
        time.sleep(0.3)  # rank 1 is not held by later sends
    dist.barrier()
hooks.close()
faults.close()
dist.destroy_process_group()
