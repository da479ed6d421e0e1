"""One gloo rank (world 1, or rank 0 of 2 for ``blocked``) whose script handles signals
its own way, with or without the hooks attached: the same script must behave the same.

Modes (``SIGNAL`` is the signal the test sends, ``TERM`` or ``INT``):
- ``default``: no handler of its own; steps until it is killed;
- ``before`` / ``after``: a handler installed before / after ``attach()`` writes
  ``CKPT`` (a checkpoint) and makes the loop stop; the script then closes and exits 0;
- ``exit``: a handler installed after ``attach()`` writes ``CKPT`` and calls ``sys.exit(0)``;
- ``chain``: a handler installed after ``attach()`` writes ``CKPT``, then calls the handler
  it replaced (the hooks' one, i.e. the default action);
- ``ignore``: ``SIG_IGN`` installed after ``attach()``; the loop stops when ``CKPT``
  appears (the test writes it) and the script exits 0;
- ``asyncio``: after ``attach()`` an asyncio loop takes the wakeup fd and handles the
  signal with ``loop.add_signal_handler`` (writes ``CKPT``, stops the loop); then the
  hooks close inside the loop, and the script prints whether the wakeup fd is still the
  loop's;
- ``blocked``: a handler installed after ``attach()``, then rank 0 enters an all_reduce
  rank 1 never joins (a handler cannot run while the main thread is in C++).

Prints ``ready`` once the handler is in place, and a JSON line
``{"stats": ..., "wakeup_is_loops": ...}`` at a clean end.

Run: python tests/workers/signal_job.py SPOOL RUN_ID PORT MODE SIGNAL CKPT HOOKS(1|0) [RANK WORLD]
"""

import asyncio
import json
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

from ranksight import trainer_hooks

spool, run_id, port, mode, sig_name, ckpt, with_hooks = sys.argv[1:8]
rank, world = (int(sys.argv[8]), int(sys.argv[9])) if len(sys.argv) > 9 else (0, 1)
SIG = signal.Signals[f"SIG{sig_name}"]
stop = []


def checkpoint(signum, frame) -> None:
    with open(ckpt, "w") as f:
        f.write(f"checkpoint on {signal.Signals(signum).name}\n")
    stop.append(signum)


def exit_handler(signum, frame) -> None:
    checkpoint(signum, frame)
    sys.exit(0)


os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
dist.init_process_group("gloo", rank=rank, world_size=world)
if mode == "before":
    signal.signal(SIG, checkpoint)
hooks = trainer_hooks.NoopHooks()
if with_hooks == "1":
    hooks = trainer_hooks.attach(spool_dir=spool, run_id=run_id)
if mode in ("after", "blocked"):
    signal.signal(SIG, checkpoint)
elif mode == "exit":
    signal.signal(SIG, exit_handler)
elif mode == "ignore":
    signal.signal(SIG, signal.SIG_IGN)
elif mode == "chain":
    replaced = signal.getsignal(SIG)

    def chained(signum, frame) -> None:
        checkpoint(signum, frame)
        if callable(replaced):
            replaced(signum, frame)
        else:  # SIG_DFL without the hooks: the default action
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    signal.signal(SIG, chained)
if rank != 0:
    while True:
        time.sleep(1)


def train(deadline: float) -> None:
    step = 0
    while not stop and time.monotonic() < deadline:
        with hooks.step(step) as s:
            with hooks.phase("forward"):
                dist.all_reduce(torch.ones(16))
                time.sleep(0.02)
            s.set(loss=1.0, tokens=16)
        if mode == "ignore" and os.path.exists(ckpt):
            break
        step += 1


async def main_async() -> bool:
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    loop.add_signal_handler(SIG, lambda: (checkpoint(SIG, None), done.set_result(True)))
    print("ready", flush=True)
    await asyncio.wait_for(done, 60)
    hooks.close()
    fd = signal.set_wakeup_fd(-1)  # whose is it after the hooks closed?
    signal.set_wakeup_fd(fd)
    return fd == loop._csock.fileno()


wakeup_is_loops = None
if mode == "asyncio":
    wakeup_is_loops = asyncio.run(main_async())
else:
    if mode == "blocked":
        print("ready", flush=True)
        with hooks.step(0):
            dist.all_reduce(torch.ones(4096))  # rank 1 never joins
    print("ready", flush=True)
    train(time.monotonic() + 60)
stats = hooks.close()
print(json.dumps({"stats": stats, "wakeup_is_loops": wakeup_is_loops}), flush=True)
dist.destroy_process_group()
