"""The Hugging Face Trainer (transformers + accelerate, pinned in the test extras) under
zero-code attach, 4 CPU ranks on gloo, a tiny randomly initialised GPT-2: steps counted
exactly, DDP's buckets recorded (accelerate builds the DDP), no finding on the clean run.
Faults from outside (a CPU quota, SIGSTOP, SIGKILL of a rank, with the text report of
each) are ``tests/e2e/test_frameworks_faults.py``'s matrix."""

from __future__ import annotations

import pytest

from tests.helpers.frameworks import Job, described, torchrun

pytest.importorskip("transformers", reason="transformers is in the test extras")
pytest.importorskip("accelerate", reason="accelerate is in the test extras")
pytestmark = pytest.mark.training


def _hf(tmp_path, steps: int) -> Job:
    return Job(str(tmp_path), torchrun(4, "hf_job.py", str(steps), str(tmp_path / "out")))


def test_hf_trainer_is_seen_whole(tmp_path):
    job = _hf(tmp_path, 12)
    assert job.wait() == 0, job.output[-3000:]
    assert job.output.count("global_step 12") == 4, job.output[-3000:]
    steps = job.query(
        "SELECT rank, count() AS n FROM steps WHERE run_id = %(r)s GROUP BY rank ORDER BY rank"
    )
    assert steps["n"].tolist() == [12] * 4, steps
    buckets = job.query(
        "SELECT rank, count() AS n FROM collectives WHERE run_id = %(r)s "
        "AND op = 'all_reduce' AND phase = 'backward' GROUP BY rank"
    )
    assert len(buckets) == 4 and (buckets["n"] >= 12).all(), buckets
    ph = job.query(
        "SELECT rank, step, phase, start_ns, end_ns FROM phases WHERE run_id = %(r)s "
        "AND phase IN ('backward', 'optimizer')"
    ).pivot_table(index=["rank", "step"], columns="phase", values=["start_ns", "end_ns"])
    assert len(ph) == 48 and (ph[("start_ns", "optimizer")] >= ph[("end_ns", "backward")]).all()
    assert job.analysis(save=True).findings == [], described(job.analysis().findings)
