"""One gloo rank that ends in a chosen way, with the hooks attached.

Modes (rank 0 does it; other ranks of the world just sleep until killed):
- ``blocked``: enters a synchronous ``dist.all_reduce`` no peer ever joins (the test
  sends SIGTERM while it is blocked inside C++);
- ``raise``: an uncaught RuntimeError in step 1;
- ``exit``: ``os._exit(17)`` in step 1 (nothing can be recorded);
- ``abort``: ``os.abort()`` in step 1 (faulthandler writes the stacks);
- ``clean``: two steps, then ``hooks.close()``.

Run: python tests/workers/rank_end.py SPOOL_DIR RUN_ID PORT RANK WORLD MODE
"""

import os
import sys
import time

import torch
import torch.distributed as dist

from ranksight import trainer_hooks

spool, run_id, port, rank, world, mode = sys.argv[1:7]
rank, world = int(rank), int(world)
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
dist.init_process_group("gloo", rank=rank, world_size=world)
hooks = trainer_hooks.attach(mesh={"dp": rank, "tp": 0, "pp": 0}, spool_dir=spool, run_id=run_id)
if rank != 0:
    while True:
        time.sleep(1)
for step in range(2):
    with hooks.step(step), hooks.phase("forward"):
        if step == 1 and mode == "blocked":
            print("entering", flush=True)
            dist.all_reduce(torch.ones(4096))
        if step == 1 and mode == "raise":
            raise RuntimeError("boom in step 1")
        if step == 1 and mode == "exit":
            time.sleep(1)  # the writer thread has flushed step 0 by now
            os._exit(17)
        if step == 1 and mode == "abort":
            os.abort()
        if world == 1:
            dist.all_reduce(torch.ones(16))
hooks.close()
dist.destroy_process_group()
