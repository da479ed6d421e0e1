"""A straggler whose slowness lands partly in the collectives it joins: the shape of a
rank starved of CPU on gloo (``tests/e2e/test_frameworks_faults.py``'s FSDP2 quota case,
4 ranks, 3% of a CPU on rank 1 from step 43 of 60). Its own compute was 5-15x its peers'
in 10 of 14 steps and normal in the rest, while every rank's step went from 310 ms to
about 1,600 ms: the rank must be named, at the measured cost."""

from __future__ import annotations

import pandas as pd
import pytest

from ranksight.analyzer import diagnose
from ranksight.analyzer.detectors.straggler import MIN_RUN_SHARE, run_share
from ranksight.analyzer.straggler import SlowRank
from tests.helpers.synthetic import make_run

MS = 1e6


def _patchy(run, rank: int, normal_steps: tuple[int, ...], peer: int):
    """``run`` with ``rank``'s phases at ``normal_steps`` copied from ``peer``'s."""
    ph = run.phases
    for s in normal_steps:
        mine = (ph["rank"] == rank) & (ph["step"] == s)
        theirs = (ph["rank"] == peer) & (ph["step"] == s)
        ph.loc[mine, ["dur_ns", "self_ns"]] = ph.loc[theirs, ["dur_ns", "self_ns"]].to_numpy()
    return run


def test_a_rank_slow_in_most_steps_from_its_onset_is_named():
    # slow in 8 of the 11 steps from step 10 (73%), normal in 14, 16 and 18
    run = _patchy(make_run(slow_rank=5, factor=3.0, onset=10, steps=21), 5, (14, 16, 18), 4)
    assert [f.culprit_rank for f in diagnose(run).findings] == [5]


def test_phases_after_the_last_step_record_are_no_step():
    """A data wait begun as the loop ended leaves phase rows with no step record; read
    as a step, it is a fast one, and 8 slow of 12 is under the chronic share."""
    run = _patchy(make_run(slow_rank=5, factor=3.0, onset=10, steps=21), 5, (14, 16, 18), 4)
    tail = run.phases[run.phases["step"] == 20].copy()
    tail["step"], tail["dur_ns"], tail["self_ns"] = 21, 0.0, 0.0
    object.__setattr__(run, "phases", pd.concat([run.phases, tail], ignore_index=True))
    assert 21 not in set(run.steps["step"])
    assert [f.culprit_rank for f in diagnose(run).findings] == [5]


def _slow(onset: int, excess_ms: float, steps: int) -> SlowRank:
    idx = list(range(onset, steps))
    return SlowRank(
        rank=1,
        cause="compute",
        onset_step=onset,
        slow_steps=len(idx),
        steps_from_onset=len(idx),
        median_ratio=6.0,
        excess_ns=pd.Series(excess_ms * MS, index=idx),
        self_ns=pd.Series(dtype=float),
        peer_median_ns=pd.Series(dtype=float),
    )


def test_the_share_is_the_measured_rise_where_the_job_step_rose_at_the_onset():
    # 40 steps at 310 ms, then 20 at 1,600 ms; the rank's own excess only 100 ms a step
    wall = pd.Series([310 * MS] * 40 + [1600 * MS] * 20, index=range(60), dtype=float)
    run_ns = float(wall.sum())
    s = _slow(40, 100.0, 60)
    own = 20 * 100 * MS / run_ns
    assert own < MIN_RUN_SHARE  # its own time alone would leave it a note
    assert run_share(s, run_ns, wall) == pytest.approx(20 * 1290 * MS / run_ns)
    assert run_share(s, run_ns, pd.Series(dtype=float)) == pytest.approx(own)


def test_no_rise_at_the_onset_leaves_the_share_at_its_own_excess():
    flat = pd.Series([310 * MS, 330 * MS] * 30, index=range(60), dtype=float)
    s = _slow(40, 100.0, 60)
    assert run_share(s, float(flat.sum()), flat) == pytest.approx(20 * 100 * MS / float(flat.sum()))
