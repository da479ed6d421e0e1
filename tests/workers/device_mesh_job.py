"""A plain script that builds a 2-D DeviceMesh ("dp_shard", "tp") with init_device_mesh
(no init_process_group of its own, no ranksight import) and takes a few optimizer steps,
all-reducing its gradients over the dp_shard group. Usage: device_mesh_job.py STEPS."""

import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh


def main() -> None:
    steps = int(sys.argv[1])
    mesh = init_device_mesh("cpu", (2, dist_world() // 2), mesh_dim_names=("dp_shard", "tp"))
    group = mesh["dp_shard"].get_group()
    model = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        loss = model(torch.randn(4, 8)).square().mean()
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad, group=group)
        opt.step()
        opt.zero_grad()
    dist.destroy_process_group()


def dist_world() -> int:
    import os

    return int(os.environ["WORLD_SIZE"])


if __name__ == "__main__":
    main()
