"""A training script that knows nothing of ranksight: plain DDP on gloo. ``ranksight
launch`` attaches the hooks from outside. Run: torchrun ... zero_code_job.py STEPS MODE
MODE: ok | fail (rank 1 raises at step 2) | slow (1 s a step)."""

import sys
import time

import torch
import torch.distributed as dist
from torch import nn

steps, mode = int(sys.argv[1]), sys.argv[2]
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = nn.parallel.DistributedDataParallel(
    nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8))
)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(16 * steps, 32)),
                                   batch_size=16)  # fmt: skip
for step, (x,) in enumerate(data):
    if mode == "fail" and rank == 1 and step == 2:
        raise RuntimeError("injected failure at step 2")
    loss = model(x).pow(2).mean()
    loss.backward()
    for p in model.parameters():  # an explicit all_reduce the default level sees
        dist.all_reduce(p.grad)
    opt.step()
    opt.zero_grad()
    if mode == "slow":
        time.sleep(1.0)
dist.destroy_process_group()
