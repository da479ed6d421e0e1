"""Bad input to the hooks: training goes on, with a clear warning (see also
tests/workers/hooked_job.py: attached before init_process_group, attached twice, a group
created after attach)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.helpers.spool import read_spool

SCRIPT = r"""
import json, sys, warnings
import torch, torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore
from ranksight import trainer_hooks

dist.init_process_group("fake", rank=0, world_size=4, store=FakeStore())
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    hooks = trainer_hooks.attach(spool_dir=sys.argv[1], run_id="odd")
    for step in range(3):
        with hooks.step(step) as s:
            with hooks.phase("forward"):
                y = torch.ones(8) * 2  # a step with no collective at all
            if step == 2:
                x = torch.ones(4)
                dist.all_reduce(x)
            s.set(loss=float(y.sum()), tokens=8, lr="not a number", grad_norm=None)
stats = hooks.close()
print(json.dumps({"stats": stats, "warnings": [str(w.message) for w in seen]}))
"""


def test_an_unknown_backend_and_steps_without_collectives(tmp_path) -> None:
    spool = str(tmp_path / "spool")
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, spool], capture_output=True, text=True, timeout=120,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert any("backend 'fake' is not one ranksight knows" in w for w in got["warnings"])
    assert got["stats"]["errors"] == 0 and got["stats"]["dropped"] == 0
    assert got["stats"]["collectives"] == 1
    frames = read_spool(spool)
    steps = frames["steps"].sort_values("step")
    assert steps["step"].tolist() == [0, 1, 2]
    assert steps["loss"].tolist() == [16.0, 16.0, 16.0]
    assert steps["lr"].isna().all() and steps["grad_norm"].isna().all()  # bad value: NaN
    coll = frames["collectives"]
    assert coll[["step", "op"]].values.tolist() == [[2, "all_reduce"]]


FREED = r"""
import gc, json, os, socket, sys, weakref
import torch, torch.distributed as dist
from ranksight import trainer_hooks

s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
dist.init_process_group("gloo", rank=0, world_size=1)
hooks = trainer_hooks.attach(spool_dir=sys.argv[1], run_id="freed")
sub = dist.new_group([0])
with hooks.step(0):
    for group in (None, sub):
        x = torch.ones(4)
        dist.all_reduce(x, group=group)
refs = [weakref.ref(dist.group.WORLD), weakref.ref(sub)]
del sub, group
dist.destroy_process_group()  # the script ends its groups while the hooks are attached
gc.collect()
freed = [r() is None for r in refs]
stats = hooks.close()
print(json.dumps({"freed": freed, "stats": stats}))
"""


def test_the_hooks_keep_no_process_group_alive_after_destroy_process_group(tmp_path) -> None:
    """A group the hooks still held would be freed only in the interpreter's teardown,
    where a gloo group's threads can abort the process ("terminate called without an
    active exception", seen once on a 2-rank DDP job)."""
    out = subprocess.run(
        [sys.executable, "-c", FREED, str(tmp_path / "spool")], capture_output=True,
        text=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["stats"]["collectives"] == 2 and got["stats"]["errors"] == 0, got
    assert got["freed"] == [True, True], "the hooks kept a destroyed process group alive"
    coll = read_spool(str(tmp_path / "spool"))["collectives"]
    assert len(set(coll["group_id"])) == 2  # both groups were resolved through the registry
