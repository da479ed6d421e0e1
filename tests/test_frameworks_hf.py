"""The Hugging Face Trainer (transformers + accelerate, pinned in the test extras) under
zero-code attach, 4 CPU ranks on gloo, a tiny randomly initialised GPT-2: steps counted
exactly, DDP's buckets recorded (accelerate builds the DDP), no finding on the clean run;
a rank SIGKILLed from outside is the crash's culprit, and the text report of that crash
(gloo's ``[/.../pair.cc:NNN]`` messages in the peers' ends) prints."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from tests.frameworks import Job, described, torchrun
from tests.outside_faults import rank_process

pytest.importorskip("transformers", reason="transformers is in the test extras")
pytest.importorskip("accelerate", reason="accelerate is in the test extras")
pytestmark = pytest.mark.e2e


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


def test_hf_rank_killed_from_outside_is_the_crash_and_its_report_prints(tmp_path):
    job = _hf(tmp_path, 400)
    victim = rank_process("hf_job.py", 1)
    job.detect(lambda fs: job.query(
        "SELECT count() AS n FROM steps WHERE run_id = %(r)s")["n"][0] >= 8, 180, 1.0)  # fmt: skip
    os.kill(victim.pid, signal.SIGKILL)
    seconds, found = job.detect(
        lambda fs: any(f.kind == "crash" and f.culprit_rank == 1 for f in fs), 120, 1.0
    )
    assert job.wait() != 0, job.output[-3000:]
    assert seconds is not None, described(found)
    final = job.analysis(save=True).findings
    assert described(final)[0][::2] == ("crash", 1), described(final)
    out = subprocess.run(
        [sys.executable, "-m", "ranksight.cli", "report", "--store", job.store_url, "--run",
         job.run_id],  # fmt: skip
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 3, out.stdout[-2000:] + out.stderr[-2000:]  # a culprit, printed
    assert "rank 1" in out.stdout and "MarkupError" not in out.stderr, out.stderr[-2000:]
    print(f"hf crash found in {seconds:.1f} s: {final[0].summary}")
