"""A small hooked gloo job for tests: dist.* collectives, send/recv, batched P2P and a
DTensor redistribute; rank 1 sleeps before each all_reduce so the others wait for it.

Run: torchrun --nproc-per-node 4 tests/workers/hooked_job.py SPOOL_DIR RUN_ID
"""

import os
import sys
import time
import warnings

import torch
import torch.distributed as dist

from ranksight import trainer_hooks

spool, run_id = sys.argv[1], sys.argv[2]
with warnings.catch_warnings(record=True) as early:
    warnings.simplefilter("always")
    noop = trainer_hooks.attach(spool_dir=spool, run_id=run_id)
assert isinstance(noop, trainer_hooks.NoopHooks), "attach before init must be a no-op"
assert any("before torch.distributed.init_process_group" in str(w.message) for w in early)

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
hooks = trainer_hooks.attach(
    mesh={"dp": rank, "tp": 0, "pp": 0},
    mesh_shape={"dp": world},
    spool_dir=spool,
    run_id=run_id,
    meta={"test": True},
)
with warnings.catch_warnings(record=True) as twice:
    warnings.simplefilter("always")
    assert trainer_hooks.attach(spool_dir=spool, run_id=run_id) is hooks
assert any("already attached" in str(w.message) for w in twice)

from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.tensor import Replicate, Shard, distribute_tensor  # noqa: E402

mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("dp", "tp"))
pairs = dist.new_group([0, 1]), dist.new_group([2, 3])
for step in range(3):
    with hooks.step(step) as s:
        with hooks.phase("forward"):
            if rank == 1:
                time.sleep(0.2)
            x = torch.ones(1000)
            dist.all_reduce(x)
            dt = distribute_tensor(torch.ones(8, 4), mesh["tp"], [Shard(0)])
            gathered = dt.redistribute(mesh["tp"], [Replicate()]).to_local()
            assert float(gathered.sum()) == 32.0
        with hooks.phase("backward"):
            peer = rank ^ 1
            ops = [dist.P2POp(dist.isend, x, peer), dist.P2POp(dist.irecv, torch.empty(1000), peer)]
            for w in dist.batch_isend_irecv(ops):
                w.wait()
            if rank % 2 == 0:
                dist.send(x, rank + 1)
            else:
                dist.recv(x, rank - 1)
            dist.all_reduce(x, group=pairs[rank // 2])
        dist.barrier()
        s.set(loss=1.0 / (step + 1), tokens=1000, lr=1e-3)
    if step == 1:  # as the agent would: ask every rank for a Flight Recorder dump
        from ranksight.trainer_hooks.flight_recorder import request_dump

        if rank == 0:
            request_dump(os.path.dirname(hooks._spool.path))
        time.sleep(3.0)  # the writer threads look every 2 s
stats = hooks.close()
assert stats["errors"] == 0, hooks._log.last_error
print(f"rank {rank} stats {stats}", flush=True)
dist.destroy_process_group()
