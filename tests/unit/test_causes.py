"""Refining a compute straggler's cause: GC pauses, CPU contention, or plain compute."""

from __future__ import annotations

import pandas as pd

from ranksight.analyzer.causes import refine_cause

MS = 1_000_000


def phases(gc_ms_rank0: float) -> pd.DataFrame:
    rows = []
    for step in range(10):
        for rank in range(4):
            rows.append({"rank": rank, "step": step, "phase": "forward", "dur_ns": 100 * MS})
            gc = gc_ms_rank0 if rank == 0 else 1.0
            rows.append({"rank": rank, "step": step, "phase": "gc", "dur_ns": gc * MS})
    return pd.DataFrame(rows)


def procs(invol_rank0: int) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "rank": range(4),
            "invol": [invol_rank0, 100, 120, 90],
            "span_ns": [10_000 * MS] * 4,
            "cpu_mean": [50.0] * 4,
        }
    )


def test_gc_pauses_explain_the_excess():
    cause, ev = refine_cause(0, [1, 2, 3], 60.0, phases(gc_ms_rank0=50.0), procs(100), 2)
    assert cause == "gc" and ev["gc_ms_per_step"] == 50.0 and ev["peers_gc_ms_per_step"] == 1.0


def test_preempted_rank_is_cpu_contention():
    cause, ev = refine_cause(0, [1, 2, 3], 60.0, phases(1.0), procs(5000), 2)
    assert cause == "cpu_contention"
    assert ev["preemptions_per_s"] == 500.0 and ev["peers_preemptions_per_s"] == 10.0


def test_otherwise_compute():
    assert refine_cause(0, [1, 2, 3], 60.0, phases(1.0), procs(110), 2)[0] == "compute"
    assert refine_cause(0, [1, 2, 3], 60.0, phases(1.0), pd.DataFrame(), 2)[0] == "compute"


def delays(share_rank0: float, share_peers: float = 0.1) -> pd.DataFrame:
    """PROCS rows with run delay: the share of wall time each rank waited for a CPU."""
    span = 10_000 * MS
    return procs(110).assign(
        delay_ns=[share_rank0 * span] + [share_peers * span] * 3, delay_samples=[10] * 4
    )


def test_run_delay_that_explains_the_excess_is_cpu_contention():
    # 200 ms steps: waiting 45% of the time for a CPU is 90 ms a step, peers 20 ms
    cause, ev = refine_cause(0, [1, 2, 3], 100.0, phases(1.0), delays(0.45), 2, step_ms=200.0)
    assert cause == "cpu_contention"
    assert ev["run_delay_ms_per_step"] == 90.0 and ev["peers_run_delay_ms_per_step"] == 20.0


def test_run_delay_like_the_peers_stays_compute_even_with_many_preemptions():
    # everyone waits the same (a shared, busy host): the excess is the rank's own compute
    many = delays(0.12).assign(invol=[5000, 100, 120, 90])
    cause, ev = refine_cause(0, [1, 2, 3], 100.0, phases(1.0), many, 2, step_ms=200.0)
    assert cause == "compute" and ev["run_delay_ms_per_step"] == 24.0
