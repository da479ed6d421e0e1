"""The reference trainer under torchrun, leaving the artifacts ``ranksight import`` reads.

Run: torchrun --nproc-per-node N tests/workers/import_artifacts.py OUT_DIR DUMP_AFTER_S
     [trainer arguments...]

- Every rank profiles steps 2-7 (``torch.profiler``, CPU activity, and CUDA where there
  is a GPU) and writes its Kineto trace to ``OUT_DIR/kineto_rank<r>.json`` when training
  ends.
- After DUMP_AFTER_S seconds (or when training ends, if sooner) every rank writes its
  Flight Recorder dump (gloo: ``TORCH_FR_BUFFER_SIZE``, NCCL:
  ``TORCH_NCCL_TRACE_BUFFER_SIZE`` must be set) to ``OUT_DIR/fr_rank<r>.json`` and, if
  training has not ended (an injected hang), exits.
"""

import os
import sys
import threading

import torch
import torch.distributed as dist

from ranksight.reference_trainer import train as trainer

out_dir, dump_after = sys.argv[1], float(sys.argv[2])
rank = int(os.environ["RANK"])
os.makedirs(out_dir, exist_ok=True)
lock = threading.Lock()
dumped = False


def dump_fr() -> None:
    global dumped
    with lock:
        if dumped:
            return
        dumped = True
    c10d = torch._C._distributed_c10d
    nccl = torch.cuda.is_available() and hasattr(c10d, "_dump_nccl_trace_json")
    data = c10d._dump_nccl_trace_json() if nccl else c10d._dump_fr_trace_json()
    with open(os.path.join(out_dir, f"fr_rank{rank}.json"), "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)


def on_timer() -> None:
    dump_fr()
    os._exit(0)  # an injected hang never returns; the dump is what this run is for


timer = threading.Timer(dump_after, on_timer)
timer.daemon = True
timer.start()
prof = torch.profiler.profile(
    activities=[torch.profiler.ProfilerActivity.CPU]
    + ([torch.profiler.ProfilerActivity.CUDA] if torch.cuda.is_available() else []),
    schedule=torch.profiler.schedule(wait=1, warmup=1, active=6, repeat=1),
)
step_fn = trainer.train_step


def profiled_step(t, step):
    result = step_fn(t, step)
    prof.step()
    return result


trainer.train_step = profiled_step
prof.start()
trainer.main(sys.argv[3:])
prof.stop()
prof.export_chrome_trace(os.path.join(out_dir, f"kineto_rank{rank}.json"))
dump_fr()
timer.cancel()
if dist.is_initialized():
    dist.destroy_process_group()
