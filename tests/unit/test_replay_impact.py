"""Impact from a bounded what-if replay, and pipeline imbalance, on synthetic runs.

The true effect of a fault is measured by writing the same run (same seed, so the same
timing noise) with and without it: the mean step time over the same steps."""

from __future__ import annotations

import pytest

from ranksight.analyzer import analyze, load_run
from ranksight.analyzer.detectors.imbalance import ImbalanceConfig, find_imbalance
from ranksight.report import EXIT_CLEAN, exit_code, to_markdown
from ranksight.store import open_store
from ranksight.synthetic import SynthConfig, write_synthetic

SHAPE = {"dp": 2, "tp": 2, "pp": 4, "steps": 30, "seed": 3}
"""16 ranks, 1F1B with 4 microbatches: a stage's excess is not the step's excess."""
ONSET = 5


@pytest.fixture
def chdb_store(chdb_url):
    with open_store(chdb_url) as store:
        store.init_schema()
        yield store


def mean_step_ns(store, run_id: str, first: int) -> float:
    """Mean wall time of the steps from ``first`` on (first start to last end over ranks)."""
    s = load_run(store, run_id).steps
    g = s[s["step"] >= first].groupby("step")
    return float((g["end_ns"].max() - g["start_ns"].min()).mean())


def true_impact(store, faulty: SynthConfig, clean: SynthConfig, onset: int = ONSET) -> float:
    """Percent by which the mean step gets shorter from ``faulty`` to ``clean``."""
    a, b = (write_synthetic(store, c).run_id for c in (faulty, clean))
    return 100.0 * (1.0 - mean_step_ns(store, b, onset) / mean_step_ns(store, a, onset))


REPLAY_ONSET = 1
"""The first analyzed step: no step before the fault to measure against, so the replay
gives the impact (analyzer/impact.py)."""


@pytest.mark.parametrize("rank,factor", [(6, 1.5), (9, 2.0)])
def test_straggler_impact_measured_before_and_after_is_close_to_the_true_slowdown(
    chdb_store, rank, factor
):
    fault = f"slow:rank={rank},factor={factor},from_step={ONSET}"
    faulty = SynthConfig(**SHAPE, faults=(fault,))
    true = true_impact(chdb_store, faulty, SynthConfig(**SHAPE))
    [f] = analyze(chdb_store, faulty.run_id, save=False).findings
    assert (f.kind, f.culprit_rank, f.evidence["impact_method"]) == (
        "straggler",
        rank,
        "before/after",
    )
    assert abs(f.impact_pct - true) < 2.5 + f.evidence["impact_error_pts"], (f.impact_pct, true)
    assert f.evidence["steps_before_after"] == [ONSET - 1, SHAPE["steps"] - ONSET]
    assert f.evidence["estimated_impact_pct"] > 0 and "the job step went from" in f.summary


@pytest.mark.parametrize("rank,factor", [(6, 1.5), (9, 2.0)])
def test_straggler_impact_from_replay_is_close_to_the_true_slowdown(chdb_store, rank, factor):
    fault = f"slow:rank={rank},factor={factor},from_step={REPLAY_ONSET}"
    faulty = SynthConfig(**SHAPE, faults=(fault,))
    true = true_impact(chdb_store, faulty, SynthConfig(**SHAPE), REPLAY_ONSET)
    analysis = analyze(chdb_store, faulty.run_id, save=False)
    [f] = analysis.findings
    assert (f.kind, f.culprit_rank, f.evidence["impact_method"]) == ("straggler", rank, "replay")
    whatif = f.evidence["whatif"]
    assert whatif["method"].startswith("replay") and whatif["slice_ranks"] == [
        r for r in range(16) if r % 2 == rank % 2 and r // 8 == rank // 8
    ]
    assert len(whatif["steps"]) == 24 and whatif["steps"][0] >= REPLAY_ONSET
    assert abs(f.impact_pct - true) < 2.5, (f.impact_pct, true, whatif)
    # the excess-time estimate it replaces is kept beside it
    assert whatif["estimate_pct"] > 0 and "what-if replay" in f.summary


def test_slow_stage_by_design_is_pipeline_imbalance_not_a_straggler(chdb_store):
    cost = (1.0, 1.0, 1.0, 1.6)
    imbalanced = SynthConfig(**SHAPE, stage_cost=cost)
    balanced = SynthConfig(**SHAPE, stage_cost=(sum(cost) / 4,) * 4)  # same work, even
    true = true_impact(chdb_store, imbalanced, balanced)
    analysis = analyze(chdb_store, imbalanced.run_id, save=False)
    assert [(f.kind, f.cause, f.culprit_rank, f.pp) for f in analysis.findings] == [
        ("pipeline_imbalance", "stage_imbalance", -1, 3)
    ]
    f = analysis.findings[0]
    assert f.evidence["ranks_in_stage"] == 4
    assert f.evidence["severity"] == ("medium" if 5 <= true < 20 else "other"), true
    assert 1.5 < f.evidence["ratio_to_other_stages"] < 1.7
    assert f.evidence["impact_method"] == "replay"  # the replay reproduced the measured step
    w = f.evidence["whatif"]
    assert sorted(w["slice_ranks"]) == list(range(16)) and w["every_dp_replica"]  # both dp
    assert abs(w["replayed_step_ms_now"] / w["measured_step_ms"] - 1) < 0.10
    assert abs(f.impact_pct - true) < 2.5, (f.impact_pct, true)
    # the report names the stage, and a run whose only finding is no fault exits clean
    assert "## 1. pipeline_imbalance: stage 3, cause stage_imbalance" in to_markdown(analysis)
    assert exit_code(analysis) == EXIT_CLEAN


def test_imbalance_comes_after_a_fault_and_clean_runs_have_none(chdb_store):
    both = SynthConfig(
        **SHAPE, stage_cost=(1.0, 1.0, 1.0, 1.6), faults=("slow:rank=2,factor=2,from_step=5",)
    )
    write_synthetic(chdb_store, both)
    kinds = [
        (f.kind, f.culprit_rank) for f in analyze(chdb_store, both.run_id, save=False).findings
    ]
    assert kinds == [("straggler", 2), ("pipeline_imbalance", -1)]
    clean = SynthConfig(**{**SHAPE, "seed": 5})
    write_synthetic(chdb_store, clean)
    assert analyze(chdb_store, clean.run_id, save=False).findings == []


def test_a_few_slow_ranks_in_a_stage_are_no_imbalance():
    import pandas as pd

    stage = pd.Series([0] * 4 + [1] * 4)
    cfg = ImbalanceConfig()
    uniform = pd.Series([100.0] * 4 + [150.0] * 4)
    assert find_imbalance(uniform, stage, cfg).stage == 1
    two_slow = pd.Series([100.0] * 4 + [100.0, 100.0, 200.0, 200.0])
    assert find_imbalance(two_slow, stage, cfg) is None
    one_rank_stages = pd.Series([100.0, 150.0])
    assert find_imbalance(one_rank_stages, pd.Series([0, 1]), cfg) is None


def test_a_replay_that_does_not_reproduce_the_measured_step_is_not_used(chdb_store, monkeypatch):
    """Where replaying the run as it was gives a step far from the measured one, its
    counterfactual is not believed: the excess-time estimate stays, with a note."""
    import dataclasses

    from ranksight.analyzer.whatif import impact as replay_impact

    fault = f"slow:rank=9,factor=2.0,from_step={REPLAY_ONSET}"
    faulty = SynthConfig(**SHAPE, faults=(fault,))
    write_synthetic(chdb_store, faulty)
    real = replay_impact._replay

    def off_by_2_5x(f, data, coords, peers):
        r, steps = real(f, data, coords, peers)
        return dataclasses.replace(r, step_ns_now=r.step_ns_now * 2.5), steps

    monkeypatch.setattr(replay_impact, "_replay", off_by_2_5x)
    analysis = analyze(chdb_store, faulty.run_id, save=False)
    [f] = analysis.findings
    assert f.culprit_rank == 9 and "whatif" not in f.evidence and f.impact_pct > 0
    assert f.evidence["impact_method"] == "excess estimate (upper bound)"
    assert any(
        "rank 9's impact counts all its extra time" in n
        and "upper bound" in n
        and "not trusted" in n
        for n in analysis.notes
    )


def test_two_slow_ranks_from_the_start_compose_to_their_joint_slowdown(chdb_store):
    # ranks 6 (dp0, pp3) and 9 (dp1, pp0): each alone in its own pipeline would claim the
    # gain of both, as the other replica is taken to arrive no later
    faults = ("slow:rank=6,factor=1.8,from_step=1", "slow:rank=9,factor=1.8,from_step=1")
    faulty = SynthConfig(**SHAPE, faults=faults)
    true = true_impact(chdb_store, faulty, SynthConfig(**SHAPE), REPLAY_ONSET)
    analysis = analyze(chdb_store, faulty.run_id, save=False)
    found = sorted(analysis.findings, key=lambda f: f.culprit_rank)
    assert [(f.kind, f.culprit_rank) for f in found] == [("straggler", 6), ("straggler", 9)]
    assert {f.evidence["impact_method"] for f in found} == {"joint replay"}
    own = sum(f.evidence["joint_whatif"]["own_impact_pct"] for f in found)
    total = sum(f.impact_pct for f in found)
    assert own > true + 5, (own, true)  # alone, each overstates: the sum would be wrong
    assert abs(total - true) < 5, (total, true, [f.evidence["joint_whatif"] for f in found])
    assert any("replay of 16 ranks with all of them" in n for n in analysis.notes)
