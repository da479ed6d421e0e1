"""A plain training script (no reference trainer) with the hooks: a small MLP trained with
DDP or FSDP2 on 2 gloo ranks. Run: torchrun --nproc-per-node 2 plain_job.py ddp|fsdp [slow]
(slow: rank 1 sleeps 150 ms in forward from step 2)."""

import sys
import time

import torch
import torch.distributed as dist
from torch import nn

from ranksight import trainer_hooks

mode = sys.argv[1]
slow = len(sys.argv) > 2 and sys.argv[2] == "slow"
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 64))
hooks = trainer_hooks.attach(mesh={"dp": rank, "tp": 0, "pp": 0}, mesh_shape={"dp": world})
if mode == "ddp":
    model = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.05)
    hooks.instrument_ddp(model)
else:
    from torch.distributed.fsdp import fully_shard

    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(model)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
gen = torch.Generator().manual_seed(rank)
for step in range(12 if slow else 4):
    with hooks.step(step) as s:
        with hooks.phase("data_wait"):
            x = torch.randn(32, 64, generator=gen)
        with hooks.phase("forward"):
            if slow and rank == 1 and step >= 2:  # a straggler: the others wait in backward
                time.sleep(0.15)
            loss = model(x).pow(2).mean()
        with hooks.phase("backward"):
            loss.backward()
        with hooks.phase("optimizer"):
            # DDP's gradients are whole tensors: the norm needs no collective (FSDP2's
            # sharded ones would need an all_reduce issued inside a DTensor op, which the
            # dispatch-level count this test compares against cannot see)
            norm = nn.utils.clip_grad_norm_(model.parameters(), 1.0) if mode == "ddp" else None
            opt.step()
            opt.zero_grad()
        s.set(loss=loss.item(), tokens=32, grad_norm=None if norm is None else norm.item())
stats = hooks.close()
assert stats["errors"] == 0 and stats["collectives"] > 0, stats
dist.destroy_process_group()
