"""Plain DDP under zero-code attach (``ranksight launch -- torchrun``, 4 gloo ranks), the
gradient all_reduce inside DDP's reducer: its buckets are recorded with the script's own
comm hook composed, its end-of-backward wait is blocked time, and a rank slowed from
outside (a CPU quota on its cgroup) is named the straggler; the clean run names no one."""

from __future__ import annotations

import pytest

from tests.frameworks import Job, described, torchrun
from tests.outside_faults import rank_process, slowed

pytestmark = pytest.mark.e2e


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


def test_rank_slowed_by_a_cpu_quota_is_the_ddp_straggler(tmp_path):
    job = Job(str(tmp_path), torchrun(4, "ddp_job.py", "100"))
    victim = rank_process("ddp_job.py", 1)
    job.detect(lambda fs: job.query(
        "SELECT count() AS n FROM steps WHERE run_id = %(r)s")["n"][0] >= 20, 180, 1.0)  # fmt: skip
    with slowed(victim.pid) as how:  # from step ~5 on: the quota lands on training
        seconds, found = job.detect(
            lambda fs: any(f.kind == "straggler" and f.culprit_rank == 1 for f in fs), 240, 2.0
        )
        assert job.wait() == 0, job.output[-3000:]
    assert seconds is not None, (how, described(found))
    final = job.analysis().findings
    assert described(final)[0][::2] == ("straggler", 1), described(final)
    assert final[0].cause == "cpu_contention", described(final)
    back = job.query(
        "SELECT rank, sum(wait_ns) / sum(end_ns - start_ns) AS waiting FROM phases "
        "WHERE run_id = %(r)s AND phase = 'backward' GROUP BY rank ORDER BY rank"
    )
    assert (back["waiting"].drop(1) > 0.5).all(), back  # the fast ranks' backward waits
    print(f"ddp straggler via {how}: found in {seconds:.1f} s; {final[0].summary}")
