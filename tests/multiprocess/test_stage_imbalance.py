"""Stage imbalance checked against the measured step (analyzer/detectors/imbalance.py): a real gloo
run of the reference trainer with an uneven layer split, and synthetic runs for the
replay, the estimate and the notes."""

from __future__ import annotations

import subprocess

import pandas as pd
import pytest

from ranksight.agent import Agent, AgentConfig
from ranksight.analyzer import analyze
from ranksight.analyzer.detectors.imbalance import ImbalanceConfig, imbalance_findings, severity
from ranksight.analyzer.whatif.slice import replay_ranks
from ranksight.launcher import processes as launch
from ranksight.report import to_markdown
from ranksight.store import open_store
from ranksight.synthetic import SynthConfig, write_synthetic

SHAPE = {"dp": 2, "tp": 2, "pp": 4, "steps": 30, "seed": 3}


@pytest.fixture(scope="module")
def uneven_run(tmp_path_factory):
    """(store, run id) of the reference trainer on 4 CPU ranks (dp2 x pp2), stage 0
    holding 3 of the 4 blocks (``--layer-split 3,1``), shipped into chdb by an agent."""
    home = tmp_path_factory.mktemp("uneven")
    spool, url, run_id = str(home / "spool"), f"chdb://{home}/store", "uneven-3-1"
    cmd = launch.trainer_cmd(dp=2, tp=1, pp=2, steps=12, run_id=run_id, inject=["none"])
    cmd += ["--layers", "4", "--layer-split", "3,1"]
    out = subprocess.run(
        cmd, env=launch.job_env(run_id, spool, url), capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    store = open_store(url)
    store.init_schema()
    agent = Agent(spool, store, config=AgentConfig(stats_interval_s=0, fsync=False))
    try:
        agent.drain()
    finally:
        agent.close()
    yield store, run_id
    store.close()


def test_an_uneven_split_of_the_reference_trainer_is_a_stage_imbalance(uneven_run):
    store, run_id = uneven_run
    analysis = analyze(store, run_id, save=False)
    found = [f for f in analysis.findings if f.kind == "pipeline_imbalance"]
    assert [(f.cause, f.pp, f.culprit_rank) for f in found] == [("stage_imbalance", 0, -1)]
    assert not [f for f in analysis.findings if f.culprit_rank >= 0]  # no rank is blamed
    f = found[0]
    ev = f.evidence
    assert ev["ratio_to_other_stages"] > 1.5 and ev["ranks_in_stage"] == 2
    assert f.impact_pct >= 5 and ev["severity"] == severity(f.impact_pct) != "low"
    assert ev["run_share"] == pytest.approx(f.impact_pct / 100, abs=1e-3)
    assert ev["impact_error_pts"] >= 0 and f"±{ev['impact_error_pts']:.0f} points" in f.summary
    w = ev["whatif"]
    if ev["impact_method"] == "replay":  # the replay reproduced the measured step
        assert abs(w["replayed_step_ms_now"] / w["measured_step_ms"] - 1) <= 0.10
        assert sorted(w["slice_ranks"]) == [0, 1, 2, 3] and w["every_dp_replica"]
    else:  # it did not: an estimate, and a note says why the replay was not used
        assert ev["impact_method"] == "estimate" and w["slowest_stage_ms"] > w["mean_stage_ms"]
        assert any("replay" in n and "not used" in n for n in analysis.notes), analysis.notes
    text = to_markdown(analysis)
    assert "## 1. pipeline_imbalance: stage 0, cause stage_imbalance" in text
    assert "rank -1" not in text and "by design" not in text


@pytest.fixture
def chdb_store(chdb_url):
    with open_store(chdb_url) as store:
        store.init_schema()
        yield store


def test_a_replay_off_the_measured_step_gives_way_to_the_estimate(chdb_store, monkeypatch):
    from ranksight.analyzer.detectors import imbalance

    run = SynthConfig(**SHAPE, stage_cost=(1.0, 1.0, 1.0, 1.6))
    write_synthetic(chdb_store, run)
    real = imbalance.replay_slice

    def off_by_3x(tables, change, ranks):  # as a live CPU run replays: 4,084 vs 1,186 ms
        r = real(tables, change, ranks)
        return type(r)(r.ranks, r.step_ns_now * 3.4, r.step_ns_changed * 3.4)

    monkeypatch.setattr(imbalance, "replay_slice", off_by_3x)
    analysis = analyze(chdb_store, run.run_id, save=False)
    [f] = analysis.findings
    assert f.evidence["impact_method"] == "estimate" and f.impact_pct >= 5
    assert any("more than 10% off): not used" in n for n in analysis.notes), analysis.notes


def test_an_imbalance_under_the_thresholds_is_a_note_not_dropped(chdb_store):
    from ranksight.analyzer import load_run
    from ranksight.analyzer.detectors.base import RunContext

    run = SynthConfig(**SHAPE, stage_cost=(1.0, 1.0, 1.0, 1.6))
    write_synthetic(chdb_store, run)
    data = load_run(chdb_store, run.run_id)
    steps = sorted(int(s) for s in data.steps["step"].unique())[1:]
    args = (data, RunContext(data).coords, data.phase_totals, steps, 0.0, [])
    found, notes = imbalance_findings(*args, ImbalanceConfig(min_impact_pct=99.0))
    assert found == [] and "under the 99% threshold for a finding" in notes[-1]
    found, notes = imbalance_findings(*args, ImbalanceConfig(min_ratio=2.0))
    assert found == [] and "under the 2.00x threshold for a stage imbalance" in notes[-1]


def test_the_replay_holds_every_data_parallel_replica_it_can():
    coords = pd.DataFrame(
        [(r, r // 8, (r // 4) % 2, r % 4) for r in range(16)], columns=["rank", "dp", "tp", "pp"]
    ).set_index("rank")
    ranks, every = replay_ranks(coords, set())
    assert sorted(ranks) == list(range(16)) and every
    ranks, every = replay_ranks(coords, set(), limit=8)  # one tp column, both dp replicas
    assert sorted(ranks) == [0, 1, 2, 3, 8, 9, 10, 11] and every
    ranks, every = replay_ranks(coords, {(0, 0)})  # a straggler's pipeline left out
    assert sorted(ranks) == list(range(4, 16)) and every
    ranks, every = replay_ranks(coords, set(), limit=4)
    assert len(ranks) == 4 and not every
