"""Every folder the hooks create is 0700 whatever the umask; folders that existed are left
as they were, and a spool root open to others is warned about (trainer_hooks/folders.py)."""

from __future__ import annotations

import glob
import json
import os
import stat
import subprocess
import sys

import pytest

from tests.helpers.spool import read_spool

SCRIPT = r"""
import json, os, socket, sys, warnings
import torch, torch.distributed as dist
from ranksight import trainer_hooks

s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
dist.init_process_group("gloo", rank=0, world_size=1)
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    hooks = trainer_hooks.attach(spool_dir=sys.argv[1], run_id="perm")
with hooks.step(0):
    dist.all_reduce(torch.ones(4))
crash_dir = os.path.dirname(hooks._exits._crash_file)
stats = hooks.close()
print(json.dumps({"stats": stats, "crash_dir": crash_dir,
                  "warnings": [str(w.message) for w in seen]}))
"""


def _run(spool: str, umask: int) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, spool], capture_output=True, text=True, timeout=120,
        env={**os.environ, "OMP_NUM_THREADS": "1"}, umask=umask,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.mark.parametrize("umask", [0o022, 0o000])
def test_every_folder_the_hooks_create_is_0700(tmp_path, umask):
    spool = tmp_path / "home" / "spool"  # neither exists: both are the hooks'
    got = _run(str(spool), umask)
    made = [tmp_path / "home", spool, spool / "perm", spool / "perm" / "a0"]
    assert {str(p): oct(_mode(p)) for p in made} == {str(p): "0o700" for p in made}
    assert got["crash_dir"] == str(spool / "perm" / "a0")  # crash stacks go there too
    assert not [w for w in got["warnings"] if "spool folder" in w]
    assert len(read_spool(str(spool))["steps"]) == 1  # and the agent reads them


@pytest.mark.parametrize("umask", [0o022, 0o000])
def test_a_folder_that_existed_is_left_alone_and_an_open_root_is_warned(tmp_path, umask):
    spool = tmp_path / "shared"
    spool.mkdir()
    os.chmod(spool, 0o777)  # the user's own choice: not ours to change
    got = _run(str(spool), umask)
    assert _mode(spool) == 0o777
    assert _mode(spool / "perm") == 0o700 and _mode(spool / "perm" / "a0") == 0o700
    (warning,) = [w for w in got["warnings"] if "spool folder" in w]
    assert str(spool) in warning and "writable by group or others" in warning
    for f in glob.glob(str(spool / "perm" / "a0" / "*")):
        assert _mode(f) & 0o077 == 0, f  # files: owner only


def test_a_sticky_shared_root_and_a_private_one_are_not_warned(tmp_path):
    from ranksight.trainer_hooks.folders import spool_root_problem

    sticky = tmp_path / "tmp-like"
    sticky.mkdir()
    os.chmod(sticky, 0o1777)
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    assert spool_root_problem(str(sticky)) is None
    assert spool_root_problem(str(private)) is None
    assert spool_root_problem(str(tmp_path / "absent")) is None
