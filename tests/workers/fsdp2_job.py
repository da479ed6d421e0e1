"""A plain FSDP2 script as PyTorch's examples write it (``fully_shard`` on each block,
then on the root, over a 1-D device mesh), knowing nothing of ranksight: a randomly
initialised MLP, random data, no downloads. Each step all_gathers the shards in forward
and backward and reduce_scatters the gradients.

Run: torchrun ... fsdp2_job.py STEPS [--sleep-ms MS]
--sleep-ms: every rank sleeps MS between steps (a paced job, so a fault from outside
lands while it runs). Prints ``fsdp2_job rank R steps N`` on each rank at the end.
"""

import argparse
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

parser = argparse.ArgumentParser()
parser.add_argument("steps", type=int)
parser.add_argument("--sleep-ms", type=float, default=0.0)
args = parser.parse_args()

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
mesh = init_device_mesh("cpu", (world,))
torch.manual_seed(0)
model = nn.Sequential(*(nn.Sequential(nn.Linear(256, 256), nn.ReLU()) for _ in range(4)),
                      nn.Linear(256, 16))  # fmt: skip
for block in model:
    fully_shard(block, mesh=mesh)
fully_shard(model, mesh=mesh)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
gen = torch.Generator().manual_seed(rank)
data = torch.utils.data.DataLoader(
    torch.utils.data.TensorDataset(torch.randn(32 * args.steps, 256, generator=gen)),
    batch_size=32,
)
for (x,) in data:
    loss = model(x).pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    if args.sleep_ms:
        time.sleep(args.sleep_ms / 1000)
print(f"fsdp2_job rank {rank} steps {len(data)}", flush=True)
dist.destroy_process_group()
