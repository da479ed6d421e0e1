"""Plain DDP under zero-code attach (``ranksight launch -- torchrun``, 4 gloo ranks), the
gradient all_reduce inside DDP's reducer: its buckets are recorded with the script's own
comm hook composed, and the clean run names no one. Faults from outside (a CPU quota,
SIGSTOP, SIGKILL of a rank) are ``tests/e2e/test_frameworks_faults.py``'s matrix."""

from __future__ import annotations

import pytest

from tests.helpers.frameworks import Job, torchrun

pytestmark = pytest.mark.training


def test_clean_ddp_records_every_bucket_through_the_scripts_comm_hook(tmp_path):
    job = Job(str(tmp_path), torchrun(4, "ddp_job.py", "40", "--comm-hook"))
    assert job.wait() == 0, job.output[-3000:]
    sums = {line.split()[-1] for line in job.output.splitlines() if line.startswith("ddp_job rank")}
    assert len(sums) == 1, job.output[-2000:]  # the replicas agree: gradients were reduced
    coll = job.query(
        "SELECT rank, step, dtype, count() AS n FROM collectives WHERE run_id = %(r)s "
        "AND op = 'all_reduce' AND phase = 'backward' GROUP BY rank, step, dtype"
    )
    # the script's fp16_compress_hook ran (float16 buckets), on every rank and step
    assert set(coll["dtype"]) == {"float16"}, coll
    assert len(coll) == 4 * 40 and (coll["n"] >= 1).all(), coll
    ends = job.query("SELECT rank, reason FROM rank_ends WHERE run_id = %(r)s ORDER BY rank")
    assert ends["reason"].tolist() == ["finished"] * 4, ends  # destroy_process_group closed
    assert job.analysis(save=True).findings == []
