"""PyTorch Lightning (pinned in the test extras) under zero-code attach, 4 CPU ranks,
strategy ddp on gloo, started by torchrun and by Lightning's own launcher (which sets
``LOCAL_RANK``/``WORLD_SIZE``/``NODE_RANK`` but no ``RANK``): every rank attaches, steps
are counted exactly, the optimizer phase holds none of the closure's forward/backward,
DDP's buckets are recorded, and the clean run has no finding."""

from __future__ import annotations

import os
import sys

import pytest

from tests.helpers.frameworks import WORKERS, Job, described, torchrun

pytest.importorskip("lightning", reason="lightning is in the test extras: pip install -e '.[test]'")
pytestmark = pytest.mark.training
STEPS = 16
LAUNCHERS = {
    "torchrun": torchrun(4, "lightning_job.py", str(STEPS)),
    "lightning": [sys.executable, os.path.join(WORKERS, "lightning_job.py"), str(STEPS)],
}


@pytest.mark.parametrize("launcher", sorted(LAUNCHERS))
def test_lightning_job_is_seen_whole(tmp_path, launcher):
    job = Job(str(tmp_path), LAUNCHERS[launcher])
    assert job.wait() == 0, job.output[-3000:]
    assert job.output.count(f"global_step {STEPS}") == 4, job.output[-3000:]
    runs = job.query("SELECT max(world_size) AS w FROM runs WHERE run_id = %(r)s")
    assert int(runs["w"][0]) == 4, runs
    steps = job.query(
        "SELECT rank, count() AS n FROM steps WHERE run_id = %(r)s GROUP BY rank ORDER BY rank"
    )
    assert steps["n"].tolist() == [STEPS] * 4, steps  # one per optimizer step, no more
    ph = job.query(
        "SELECT rank, step, phase, start_ns, end_ns FROM phases WHERE run_id = %(r)s "
        "AND phase IN ('forward', 'backward', 'optimizer')"
    )
    per = ph.pivot_table(index=["rank", "step"], columns="phase", values=["start_ns", "end_ns"])
    assert len(per) == 4 * STEPS and not per.isna().any().any(), per
    # Lightning's optimizer.step(closure): the closure's forward and backward come first,
    # the optimizer phase after them, never around them
    assert (per[("start_ns", "optimizer")] >= per[("end_ns", "backward")]).all(), per
    assert (per[("end_ns", "forward")] <= per[("start_ns", "backward")]).all(), per
    buckets = job.query(
        "SELECT rank, count() AS n FROM collectives WHERE run_id = %(r)s "
        "AND op = 'all_reduce' AND phase = 'backward' GROUP BY rank"
    )
    assert len(buckets) == 4 and (buckets["n"] >= STEPS).all(), buckets
    assert job.analysis(save=True).findings == [], described(job.analysis().findings)
