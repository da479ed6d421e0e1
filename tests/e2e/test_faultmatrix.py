"""The fault matrix: expectations from ground truth, scoring, and the quick subset run for
real (clean, slow, crash on 8 gloo ranks)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ranksight.faultmatrix import SCENARIOS, SHAPE, expectation, matches, pick, score
from ranksight.reference_trainer.faults import faults_ground_truth, parse_faults


def _expect(spec: str):
    return expectation(faults_ground_truth(parse_faults([spec]), SHAPE), SHAPE)


def _f(kind, cause, rank, **evidence):
    return {"kind": kind, "cause": cause, "culprit_rank": rank, "evidence": evidence}


def test_expectations_follow_the_recorded_fault():
    assert _expect("none").label == "(none)"
    assert _expect("slow:rank=5,factor=3").label == "straggler/compute @ 5"
    assert _expect("slow_link:rank=2,delay_ms=5,group=tp").culprits == {2, 3}
    assert _expect("slow_link:rank=1,delay_ms=5,group=dp").culprits == {1, 5}
    assert _expect("slow_link:rank=2,delay_ms=5,group=pp").culprits == {2, 0}
    assert _expect("hang:rank=3,from_step=5").label == "hang @ 3"
    assert _expect("cpu_contention:rank=4").label == "straggler/cpu_contention @ 4"
    assert _expect("gc_pauses:delay_ms=500").label == "transient_straggler/gc @ -1"
    every = {s.inject.split(":")[0] for s in SCENARIOS} - {"none"}
    assert _expect("slow_turns:factor=4,every=2").label == "transient_straggler/compute @ -1"
    assert every == {"slow", "slow_link", "hang", "crash", "desync", "data_stall",
                     "cpu_contention", "gc_storm", "nan", "gc_pauses", "slow_turns"}  # fmt: skip


def test_a_kind_the_analyzer_does_not_make_is_missed_not_passed():
    e = _expect("hang:rank=3,from_step=5")
    s = score([], e)
    assert (s.verdict, s.passed) == ("MISSED", False)
    s = score([_f("straggler", "compute", 6)], e)
    assert (s.verdict, s.false_findings) == ("MISSED", ("straggler/compute @ 6",))


def test_verdicts():
    slow = _expect("slow:rank=5,factor=3")
    assert score([_f("straggler", "compute", 5)], slow).passed
    assert score([_f("straggler", "data_loader", 5)], slow).verdict == "WRONG"
    both = score([_f("straggler", "compute", 5), _f("straggler", "compute", 4)], slow)
    assert (both.verdict, both.false_findings) == ("FALSE", ("straggler/compute @ 4",))
    clean = _expect("none")
    assert score([], clean).passed
    assert score([_f("straggler", "compute", 1)], clean).verdict == "FALSE"
    # a stage slower by design is not a fault: neither a false finding nor a match
    design = _f("pipeline_imbalance", "stage_imbalance", -1)
    assert score([design], clean).passed
    assert score([design, _f("straggler", "compute", 5)], slow).passed


def test_an_uneven_split_expects_its_heavy_stage_and_nothing_else():
    (sc,) = pick("uneven_split")
    assert sc.trainer_args == ["--layers", "4", "--layer-split", "3,1"]
    e = expectation([], SHAPE, layer_split=[3, 1])
    assert e.label == "pipeline_imbalance/stage_imbalance @ stage 0"
    design = {**_f("pipeline_imbalance", "stage_imbalance", -1), "pp": 0}
    assert score([design], e).passed
    assert score([{**design, "pp": 1}], e).verdict == "WRONG"  # the other stage
    assert score([], e).verdict == "MISSED"
    with_false = score([design, _f("straggler", "compute", 1)], e)
    assert (with_false.verdict, with_false.false_findings) == ("FALSE", ("straggler/compute @ 1",))
    assert expectation([], SHAPE, layer_split=[2, 2]).kind is None
    assert expectation([], SHAPE, layer_split=[1, 2, 2]).stage is None  # a tie: any stage
    with pytest.raises(ValueError, match="evenly split pipeline only"):
        expectation(faults_ground_truth(parse_faults(["slow:rank=1,factor=2"]), SHAPE), SHAPE,
                    layer_split=[3, 1])  # fmt: skip


def test_a_late_fault_expects_a_before_after_impact():
    (sc,) = pick("slow-late")
    faults = faults_ground_truth(parse_faults([sc.inject]), SHAPE)
    e = expectation(faults, SHAPE, impact_method=sc.impact_method)
    assert (e.label, e.from_step) == ("straggler/compute @ 5 (before/after impact)", 12)
    assert score([_f("straggler", "compute", 5, impact_method="before/after")], e).passed
    estimated = _f("straggler", "compute", 5, impact_method="excess estimate (upper bound)")
    assert score([estimated], e).verdict == "WRONG"


def test_slow_link_may_name_a_member_or_the_group():
    e = _expect("slow_link:rank=2,delay_ms=5,group=tp")
    assert matches(_f("slow_communication", "communication", 3), e)
    assert matches(_f("slow_communication", "communication", -1, group_ranks="2,3"), e)
    assert not matches(_f("slow_communication", "communication", -1, group_ranks="0,1"), e)
    assert not matches(_f("slow_communication", "communication", 0), e)
    assert not matches(_f("straggler", "compute", 2), e)


def test_scenario_selection():
    assert [s.name for s in pick(quick=True)] == ["clean-a", "slow", "crash"]
    assert [s.name for s in pick("nan, hang")] == ["nan", "hang"]
    with pytest.raises(ValueError, match="unknown scenarios \\['nope'\\]"):
        pick("hang,nope")


@pytest.mark.training
def test_quick_matrix_runs_for_real_and_scores_against_ground_truth(tmp_path):
    out_md, out_json = tmp_path / "fm.md", tmp_path / "fm.json"
    env = {**os.environ, "COLUMNS": "200"}
    proc = subprocess.run(
        [sys.executable, "-m", "ranksight.cli", "faultmatrix", "--quick", "--home",
         str(tmp_path / "home"), "--out", str(out_md), "--json", str(out_json)],
        capture_output=True, text=True, timeout=900, env=env,
    )  # fmt: skip
    assert proc.returncode in (0, 1), proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads(out_json.read_text())
    rows = {r["scenario"]: r for r in doc["rows"]}
    assert list(rows) == ["clean-a", "slow", "crash"]
    clean, slow, crash = rows["clean-a"], rows["slow"], rows["crash"]
    assert clean["verdict"] == "right", clean["findings"]  # no finding on a clean run
    # the analyzer makes compute-straggler findings: this one must be right, and timed
    assert (slow["verdict"], slow["found"]) == ("right", "straggler/compute @ 5"), slow
    assert slow["detect_s"] is not None and 0 < slow["detect_s"] < 120
    assert slow["detect_steps"] >= 1 and slow["job_rc"] == 0
    # crash: a crash finding names rank 6 (exit code 17, torchrun's root cause) and no one else
    named = [f for f in crash["findings"] if f["kind"] == "crash" and f["culprit_rank"] == 6]
    assert crash["job_rc"] != 0 and "rank 6 failed first" in crash["note"]
    assert crash["verdict"] == "right" and named and not crash["false_findings"], crash
    assert named[0]["evidence"]["code"] == 17
    assert (
        (proc.returncode == 0)
        == doc["passed"]
        == all(r["verdict"] == "right" for r in rows.values())
    )
    md = out_md.read_text()
    assert "| slow | slow:rank=5,factor=3,from_step=4 |" in md and doc["machine"]["cpus"] in md
