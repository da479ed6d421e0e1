"""Plain DDP as PyTorch's examples write it, knowing nothing of ranksight: the gradient
all_reduce happens inside DDP's reducer (no ``dist.all_reduce`` in the script).

Run: torchrun ... ddp_job.py STEPS [--comm-hook] [--sleep-ms MS]
--comm-hook: the script registers its own comm hook (a fp16-compressing all_reduce, as
users do), which ranksight must compose with, not replace. --sleep-ms: every rank sleeps
MS between steps (a paced job, so a fault from outside lands while it runs).
Writes ``ddp_job rank R steps N grad_sum X`` on each rank at the end.
"""

import argparse
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

parser = argparse.ArgumentParser()
parser.add_argument("steps", type=int)
parser.add_argument("--comm-hook", action="store_true")
parser.add_argument("--sleep-ms", type=float, default=0.0)
args = parser.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = nn.parallel.DistributedDataParallel(
    nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                  nn.Linear(512, 16)),
    bucket_cap_mb=1,
)  # fmt: skip
if args.comm_hook:
    model.register_comm_hook(None, default_hooks.fp16_compress_hook)
opt = torch.optim.SGD(model.parameters(), lr=0.001)
gen = torch.Generator().manual_seed(rank)
data = torch.utils.data.DataLoader(
    torch.utils.data.TensorDataset(torch.randn(64 * args.steps, 256, generator=gen)),
    batch_size=64,
)
for (x,) in data:
    loss = model(x).pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    if args.sleep_ms:
        time.sleep(args.sleep_ms / 1000)
total = sum(float(p.detach().sum()) for p in model.parameters())
print(f"ddp_job rank {rank} steps {len(data)} grad_sum {total:.6f}", flush=True)
dist.destroy_process_group()
