"""Completeness: on the real 3D-parallel reference trainer (DP2 x TP2 x PP2, gloo), the
default hook level records as many collectives per rank and group as an independent
dispatcher-level count sees (RANKSIGHT_VERIFY_COUNTS)."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.training


def test_default_level_sees_every_collective_of_the_reference_trainer(tmp_path):
    spool = str(tmp_path / "spool")
    env = {
        **os.environ,
        "RANKSIGHT_VERIFY_COUNTS": "1",
        "RANKSIGHT_SPOOL_DIR": spool,
        "RANKSIGHT_RUN_ID": "counts",
        "RANKSIGHT_LEVEL": "default",
        "OMP_NUM_THREADS": "1",
    }
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=8",
        "-m",
        "ranksight.reference_trainer.train",
        "--dp",
        "2",
        "--tp",
        "2",
        "--pp",
        "2",
        "--steps",
        "3",
        "--hooks",
        "default",
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    files = sorted(glob.glob(os.path.join(spool, "counts", "a0", "counts-rank*.json")))
    assert len(files) == 8
    for path in files:
        with open(path) as f:
            counts = json.load(f)
        assert counts["dispatch"], path
        assert "<unresolved>" not in counts["dispatch"]
        assert counts["hooks"] == counts["dispatch"], path
