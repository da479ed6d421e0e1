"""A small hooked gloo job that runs at a set pace, for the agent's fault tests: each step
has a forward and a backward phase with a few all_reduces, then sleeps. Each rank writes
its own counters (``hooks.close()``: records written to the spool, records dropped) to
``OUT_DIR/rank<r>.json``.

Run: torchrun --nproc-per-node 2 tests/workers/paced_job.py SPOOL RUN_ID STEPS PACE_S OUT_DIR
"""

import json
import os
import sys
import time

import torch
import torch.distributed as dist

from ranksight import trainer_hooks

spool, run_id, steps, pace, out = sys.argv[1:6]
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
segment = int(os.environ.get("RANKSIGHT_TEST_SEGMENT_BYTES", str(64 << 20)))
hooks = trainer_hooks.attach(
    mesh={"dp": rank, "tp": 0, "pp": 0},
    mesh_shape={"dp": world},
    spool_dir=spool,
    run_id=run_id,
    spool_segment_bytes=segment,
)
x = torch.ones(256)
for step in range(int(steps)):
    with hooks.step(step) as s:
        with hooks.phase("forward"):
            for _ in range(4):
                dist.all_reduce(x)
        with hooks.phase("backward"):
            for _ in range(4):
                dist.all_reduce(x)
        s.set(loss=1.0 / (step + 1), tokens=256, lr=1e-3)
    time.sleep(float(pace))
stats = hooks.close()
with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
    json.dump({"rank": rank, **stats}, f)
dist.destroy_process_group()
