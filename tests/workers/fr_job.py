"""A hooked 2+-rank data-parallel training job that leaves Flight Recorder dumps.

Run: torchrun --nproc-per-node 2 tests/workers/fr_job.py MODE OUT_DIR SECONDS

- GPU (NCCL) when CUDA is there and ``FR_JOB_DEVICE`` is not ``cpu``; else CPU (gloo).
- Trains an MLP with DDP for SECONDS (at least 3 steps), with a broadcast and an
  all_gather on a sub-group of ranks 0 and 1 and a send/recv between them each step,
  under the ranksight hooks (spool from ``RANKSIGHT_SPOOL_DIR``, run id from
  ``RANKSIGHT_RUN_ID``).
- MODE ``train``: then writes this rank's Flight Recorder dump, pickle and JSON, to
  ``OUT_DIR/fr_<backend>_rank<r>.pkl`` / ``.json``.
- MODE ``hang``: then rank 1 never joins a last all_reduce and sleeps ``FR_JOB_HANG_S``
  (default 30) seconds; the other ranks wait in it until the process group timeout
  (``FR_JOB_TIMEOUT_S``, default 60), when NCCL's watchdog writes the dump if
  ``TORCH_NCCL_DUMP_ON_TIMEOUT=1``.

Sizes: ``FR_JOB_DIM`` (default 4096 on GPU, 64 on CPU), ``FR_JOB_LAYERS`` (default 8 / 2).
Set ``TORCH_NCCL_TRACE_BUFFER_SIZE`` (NCCL) or ``TORCH_FR_BUFFER_SIZE`` (gloo) to record.
"""

import datetime
import os
import sys
import time

import torch
import torch.distributed as dist

from ranksight import trainer_hooks

mode, out_dir, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
assert mode in ("train", "hang"), f"MODE must be train or hang, got {mode!r}"
cuda = torch.cuda.is_available() and os.environ.get("FR_JOB_DEVICE", "cuda") != "cpu"
local = int(os.environ.get("LOCAL_RANK", "0"))
timeout = datetime.timedelta(seconds=float(os.environ.get("FR_JOB_TIMEOUT_S", "60")))
if cuda:
    device = torch.device("cuda", local)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", timeout=timeout, device_id=device)
else:
    device = torch.device("cpu")
    dist.init_process_group("gloo", timeout=timeout)
rank, world = dist.get_rank(), dist.get_world_size()
backend = "nccl" if cuda else "gloo"
hooks = trainer_hooks.attach(mesh={"dp": rank, "tp": 0, "pp": 0}, mesh_shape={"dp": world})
pair = dist.new_group([0, 1])

dim = int(os.environ.get("FR_JOB_DIM", "4096" if cuda else "64"))
layers = int(os.environ.get("FR_JOB_LAYERS", "8" if cuda else "2"))
torch.manual_seed(0)
model = torch.nn.Sequential(*[torch.nn.Linear(dim, dim) for _ in range(layers)]).to(device)
ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local] if cuda else None)
opt = torch.optim.AdamW(ddp.parameters(), lr=1e-4)
batch = torch.randn(4 * dim if cuda else 32, dim, device=device)

start, step = time.time(), 0
while step < 3 or time.time() - start < seconds:
    with hooks.step(step):
        with hooks.phase("forward"):
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
                loss = ddp(batch).float().pow(2).mean()
        with hooks.phase("backward"):
            loss.backward()
        with hooks.phase("optimizer"):
            opt.step()
            opt.zero_grad(set_to_none=True)
        if rank < 2:
            flag = torch.tensor([step], device=device)
            dist.broadcast(flag, 0, group=pair)
            gathered = torch.empty(2 * 16, device=device)
            dist.all_gather_into_tensor(
                gathered, torch.full((16,), float(rank), device=device), group=pair
            )
            if rank == 0:
                dist.send(torch.ones(8, device=device), 1)
            else:
                dist.recv(torch.empty(8, device=device), 0)
        if cuda:
            torch.cuda.synchronize()
    step += 1
print(f"rank {rank}: {step} steps in {time.time() - start:.1f} s on {backend}", flush=True)

if mode == "train":
    dist.barrier()
    C = torch._C._distributed_c10d
    dump = getattr(C, "_dump_nccl_trace", None) if cuda else None
    dump = dump or C._dump_fr_trace
    dump_json = getattr(C, "_dump_nccl_trace_json", None) if cuda else None
    dump_json = dump_json or C._dump_fr_trace_json
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, f"fr_{backend}_rank{rank}.pkl"), "wb") as f:
        f.write(dump())
    with open(os.path.join(out_dir, f"fr_{backend}_rank{rank}.json"), "wb") as f:
        data = dump_json()
        f.write(data.encode() if isinstance(data, str) else data)
    hooks.close()
    dist.destroy_process_group()
else:
    if rank == 1:
        time.sleep(float(os.environ.get("FR_JOB_HANG_S", "30")))
        os._exit(0)
    x = torch.ones(4, device=device)
    dist.all_reduce(x)  # rank 1 never joins
    if cuda:
        torch.cuda.synchronize()  # NCCL is asynchronous: wait here until the timeout
    print(f"rank {rank}: the all_reduce returned", flush=True)
    os._exit(0)
