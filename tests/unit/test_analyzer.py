"""Pure analyzer tests on synthetic cross-rank tables with a known answer."""

from __future__ import annotations

import numpy as np
import pytest

from ranksight.analyzer import StragglerConfig, diagnose
from ranksight.analyzer.findings import Finding
from ranksight.analyzer.groups import group_axis
from tests.helpers.synthetic import make_run


def test_names_the_slow_rank_with_compute_cause_and_onset():
    analysis = diagnose(make_run(slow_rank=5, factor=3.0, onset=4))
    assert [f.culprit_rank for f in analysis.findings] == [5]
    f = analysis.findings[0]
    assert (f.kind, f.cause) == ("straggler", "compute")
    assert (f.dp, f.tp, f.pp) == (1, 1, 0)
    assert f.evidence["onset_step"] == 4
    assert 2.5 < f.evidence["median_ratio"] < 3.5
    # its TP peer (rank 4) waited for it in every TP all_reduce from the onset on
    victims = {v["rank"] for v in f.evidence["waited_for_it"]["victims"]}
    assert victims == {4}
    assert f.evidence["waited_for_it"]["last_share"] == 1.0


def test_impact_matches_the_removed_excess():
    analysis = diagnose(make_run(slow_rank=2, factor=2.0, onset=0, noise=0.0))
    f = analysis.findings[0]
    # every step: 200 ms (slow rank) + 20 ms; without it 100 + 20 -> 100/220 = 45.5 %
    assert f.impact_pct == pytest.approx(100 * 100 / 220, abs=1.0)


def test_clean_run_has_no_findings():
    for seed in range(5):
        assert diagnose(make_run(slow_rank=None, seed=seed, noise=0.08)).findings == []


def test_transient_blip_is_not_a_culprit():
    # slow only in the last 2 steps: fewer than min_slow_steps
    analysis = diagnose(make_run(slow_rank=3, onset=18, steps=20))
    assert analysis.findings == []


def test_victim_that_also_looks_slow_is_not_named():
    # rank 4 also looks slow (its self time includes a wait we failed to subtract)
    run = make_run(slow_rank=5, factor=3.0, onset=2)
    ph = run.phases
    mask = (ph["rank"] == 4) & (ph["step"] >= 2)
    ph.loc[mask, "self_ns"] = ph.loc[(ph["rank"] == 5) & (ph["step"] >= 2), "self_ns"].to_numpy()
    analysis = diagnose(run)
    assert [f.culprit_rank for f in analysis.findings] == [5]
    assert any("rank 4" in n for n in analysis.notes)


def test_finding_round_trips_through_a_table_row():
    f = diagnose(make_run()).findings[0]
    row = f.to_row("r", 0, 123, 0)
    assert Finding.from_row(row) == Finding.from_row(Finding.from_row(row).to_row("r", 0, 1, 0))
    assert Finding.from_row(row).evidence["onset_step"] == f.evidence["onset_step"]


def test_group_axis_from_coordinates():
    import pandas as pd

    coords = pd.DataFrame(
        {
            "dp": [0, 0, 0, 0, 1, 1, 1, 1],
            "pp": [0, 0, 1, 1, 0, 0, 1, 1],
            "tp": [0, 1, 0, 1, 0, 1, 0, 1],
        },
        index=range(8),
    )
    assert group_axis([0, 1], coords) == "tp"
    assert group_axis([0, 4], coords) == "dp"
    assert group_axis([0, 2], coords) == "pp"
    assert group_axis(list(range(8)), coords) == "world"
    assert group_axis([0, 3], coords) == "mixed"


@pytest.mark.parametrize(
    "bad",
    [{"ratio_threshold": 1.0}, {"min_slow_fraction": 0}, {"min_slow_steps": 0}, {"skip_steps": -1}],
)
def test_config_validation(bad):
    with pytest.raises(ValueError):
        StragglerConfig(**bad)


def test_with_one_same_stage_peer_only_a_large_gap_names_a_rank():
    import pandas as pd

    from ranksight.analyzer.straggler import find_slow_ranks

    def totals(factor: float) -> pd.DataFrame:
        rows = [
            {"rank": r, "step": s, "compute_self": 100e6 * (factor if r == 1 and s >= 3 else 1.0),
             "data_self": 1e6}
            for r in (0, 1) for s in range(12)
        ]  # fmt: skip
        return pd.DataFrame(rows)

    role = pd.Series({0: 0, 1: 0})  # DP2: two ranks, one stage
    steps = pd.Series({s: 150e6 for s in range(12)})
    assert find_slow_ranks(totals(1.4), role, steps) == []  # which of the two is off?
    (slow,) = find_slow_ranks(totals(3.0), role, steps)
    assert (slow.rank, slow.onset_step) == (1, 3)


def test_a_noisy_step_just_before_a_clear_onset_is_not_the_onset():
    """A rank 1.4x its peers at step 3 by noise, then 4.7x from step 4 (as in a demo on a
    shared 2-core host): the onset is step 4; a steady 1.5x from step 3 keeps step 3."""
    import pandas as pd

    from ranksight.analyzer.straggler import find_slow_ranks, settled_onset

    def totals(noise: float, factor: float, onset: int) -> pd.DataFrame:
        def t(r: int, s: int) -> float:
            if r != 1:
                return 100e6
            return 100e6 * (factor if s >= onset else noise if s == onset - 1 else 1.0)

        rows = [
            {"rank": r, "step": s, "compute_self": t(r, s), "data_self": 1e6}
            for r in (0, 1, 2, 3)
            for s in range(16)
        ]
        return pd.DataFrame(rows)

    role = pd.Series({r: 0 for r in range(4)})
    steps = pd.Series({s: 150e6 for s in range(16)})
    (slow,) = find_slow_ranks(totals(1.4, 4.7, 4), role, steps)
    assert (slow.rank, slow.onset_step, slow.steps_from_onset) == (1, 4, 12)
    (steady,) = find_slow_ranks(totals(1.0, 1.5, 3), role, steps)
    assert steady.onset_step == 3
    ramp = np.array([1.0, 1.3, 1.6, 2.0, 3.0, 4.0, 4.0, 4.0])
    assert settled_onset(ramp, 1) == 3  # the first step at least halfway to the level
    assert settled_onset(np.array([1.0, 1.3, np.nan, 4.0, 4.0]), 1) == 1  # no data: kept


def test_group_axes_agree_with_the_one_group_rule():
    import pandas as pd

    from ranksight.analyzer.groups import group_axes, group_axis

    rows = [
        {"rank": r, "dp": (r // 2) % 4, "tp": r % 2, "pp": r // 8, "host": "h"} for r in range(16)
    ]
    coords = pd.DataFrame(rows).set_index("rank")
    ids = ["tp", "dp", "pp", "world", "mixed", "unknown"]
    members = ["0,1", "0,2,4,6", "0,8", ",".join(map(str, range(16))), "0,3", "0,99"]
    groups = pd.DataFrame({"group_id": ids, "group_ranks": members})
    expected = {
        g: group_axis([int(x) for x in m.split(",")], coords)
        for g, m in zip(ids, members, strict=True)
    }
    assert group_axes(groups, coords) == expected
    assert expected == {"tp": "tp", "dp": "dp", "pp": "pp", "world": "world", "mixed": "mixed",
                        "unknown": "mixed"}  # fmt: skip
