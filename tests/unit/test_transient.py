"""Transient stragglers (analyzer/detectors/transient.py): slow steps whose slow rank moves, found
whoever holds each step up, costed by the measured excess, and no chronic culprit named
where there is none."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from ranksight.analyzer.detectors.transient import TransientConfig, transient_findings

MS = 1_000_000
STEP_MS = 150


def run(slow: dict[int, tuple[int, float, str]], world=8, steps=20, seed=0, tokens=None, shown=1.0):
    """Step records and per-rank self times of a synchronous job: ``slow`` maps step ->
    (rank, extra ms, "gc" | "compute" | "data"); every rank ends the step when the
    slowest does (it waits in a collective, which self time leaves out). ``shown``: the
    share of a slow rank's extra that lengthens the step (below 1: a pipeline that
    overlapped the rest with other stages' work)."""
    rng = np.random.default_rng(seed)
    rows, totals, t = [], [], 0
    for step in range(steps):
        busy = {r: STEP_MS * 0.8 * MS * (1 + 0.03 * rng.standard_normal()) for r in range(world)}
        gc = dict.fromkeys(range(world), 0.2 * MS)
        data = dict.fromkeys(range(world), 0.3 * MS)
        hidden = 0.0
        if step in slow:
            r, extra, how = slow[step]
            busy[r] += extra * MS
            hidden = (1.0 - shown) * extra * MS
            if how == "gc":
                gc[r] += extra * MS
            if how == "data":
                data[r] += extra * MS
        length = max(busy.values()) - hidden + 0.2 * STEP_MS * MS
        for r in range(world):
            start = t + int(rng.integers(0, 2 * MS))
            tok = tokens(step, r) if tokens else 1024
            rows.append({"rank": r, "step": step, "start_ns": start, "end_ns": t + int(length),
                         "loss": 1.0, "tokens": tok})  # fmt: skip
            compute = busy[r] - (data[r] if step in slow and slow[step][2] == "data" else 0.3 * MS)
            totals.append({"rank": r, "step": step, "compute_self": int(compute),
                           "data_self": int(data[r]), "gc_self": int(gc[r])})  # fmt: skip
        t += int(length) + 5 * MS
    coords = pd.DataFrame(
        {"rank": range(world), "dp": [r // 2 for r in range(world)], "tp": [r % 2 for r in range(world)],
         "pp": [0] * world, "host": [f"node{r // 4}" for r in range(world)]}
    ).set_index("rank")  # fmt: skip
    return pd.DataFrame(rows), pd.DataFrame(totals), coords


def find(slow, chronic=(), **kw):
    steps, totals, coords = run(slow, **kw)
    analyzed = sorted(steps["step"].unique())[1:]
    return transient_findings(steps, totals, coords, analyzed, list(chronic)), steps


def measured_share(steps: pd.DataFrame) -> float:
    """The slow steps' excess over the median job step, as a share of the analyzed run."""
    sub = steps[steps["step"] >= 1]
    wall = sub.groupby("step")["end_ns"].max() - sub.groupby("step")["start_ns"].min()
    base = wall.median()
    late = wall[wall > 1.2 * base]
    return float((late - base).sum() / wall.sum())


def test_gc_pauses_on_a_different_rank_each_time_are_one_finding_naming_no_rank():
    slow = {5: (1, 3600, "gc"), 8: (3, 3900, "gc"), 11: (6, 3500, "gc"), 14: (0, 4000, "gc"),
            17: (4, 3700, "gc"), 19: (7, 3800, "gc")}  # fmt: skip
    (findings, notes), steps = find(slow)
    [f] = findings
    assert (f.kind, f.cause, f.culprit_rank) == ("transient_straggler", "gc", -1)
    assert set(f.evidence["ranks"]) == {0, 1, 3, 4, 6, 7}
    assert [p["step"] for p in f.evidence["per_step"]] == sorted(slow)
    assert [p["rank"] for p in f.evidence["per_step"]] == [slow[s][0] for s in sorted(slow)]
    assert f.impact_pct == pytest.approx(100 * measured_share(steps), abs=0.2)
    assert (
        "no chronic straggler" in f.summary
        and "garbage-collection pauses of 3.5-4.0 s" in f.summary
    )
    assert f.who() == "ranks 0,1,3,4,6,7 in turn"


def test_one_rank_slow_now_and_then_is_named():
    slow = {3: (5, 900, "compute"), 9: (5, 1100, "compute"), 15: (5, 1000, "compute"),
            18: (2, 950, "compute")}  # fmt: skip
    (findings, _), _ = find(slow)
    [f] = findings
    assert (f.culprit_rank, f.cause) == (5, "compute") and f.evidence["steps_by_rank"]["5"] == 3


def test_a_chronic_stragglers_steps_are_its_own():
    slow = {s: (2, 800, "compute") for s in range(4, 20)}
    (findings, notes), _ = find(slow, chronic=[2])
    assert findings == [] and notes == []


def test_data_waits_and_longer_sequences_are_told_apart():
    (findings, _), _ = find({4: (1, 700, "data"), 9: (2, 800, "data"), 13: (3, 750, "data")})
    assert [f.cause for f in findings] == ["data_loader"]
    long_at = {6: 4, 10: 6, 15: 0}

    def tokens(step, rank):
        return 4096 if long_at.get(step) == rank else 1024

    slow = {s: (r, 900, "compute") for s, r in long_at.items()}
    (findings, _), _ = find(slow, tokens=tokens)
    assert [f.cause for f in findings] == ["data_imbalance"]


def test_a_clean_run_and_a_few_cheap_blips_name_nothing():
    (findings, notes), _ = find({})
    assert findings == [] and notes == []
    (findings, notes), _ = find({7: (3, 110, "gc"), 12: (4, 120, "gc")})  # 2 steps, +75%
    assert findings == [] and "under the threshold" in notes[0]


def test_bad_thresholds_are_refused():
    with pytest.raises(ValueError, match="step_excess"):
        TransientConfig(step_excess=0)


TURNS = {4: 0, 6: 3, 8: 6, 10: 1, 12: 4, 14: 7, 16: 2, 18: 5}
"""The ``slow_turns`` fault's turns (step -> rank) with every=2 from step 4 on 8 ranks."""


def test_a_lone_rank_4x_slow_is_found_though_the_pipeline_hides_most_of_it():
    """A rank 4x its stage in its step (extra 3 x 120 ms) that lengthens the job step by
    only about 35% (shown 15%): under the 50% gate, but no host jitter slows one rank alone."""
    slow = {s: (r, 360.0, "compute") for s, r in TURNS.items()}
    (findings, _), steps = find(slow, shown=0.15)
    [f] = findings
    assert (f.kind, f.cause, f.culprit_rank) == ("transient_straggler", "compute", -1)
    assert [p["step"] for p in f.evidence["per_step"]] == sorted(TURNS)
    assert f.impact_pct == pytest.approx(100 * measured_share(steps), abs=0.2)


def test_a_rank_1_5x_its_stage_in_a_30_percent_longer_step_is_not_a_lone_straggler():
    """The same steps 30% longer, each held by one rank only 1.5x its stage: under both
    gates (jitter, or a mild slowdown the 50% gate leaves alone)."""
    slow = {s: (r, 60.0, "compute") for s, r in TURNS.items()}
    (findings, _), _ = find(slow, shown=0.75)
    assert findings == []
    strict = TransientConfig(lone_ratio=1.4)
    steps, totals, coords = run(slow, shown=0.75)
    analyzed = sorted(steps["step"].unique())[1:]
    assert transient_findings(steps, totals, coords, analyzed, [], strict)[0]  # can fire
