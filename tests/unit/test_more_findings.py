"""Slow communication, desync and NaN findings on synthetic frames with known answers."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd

from ranksight.analyzer.detectors.desync import desync_findings
from ranksight.analyzer.detectors.nan import nan_findings
from ranksight.analyzer.detectors.slow_comm import slow_comm_findings

MS = 1_000_000


def coords(world=8):
    return pd.DataFrame(
        {
            "rank": range(world),
            "dp": [r // 4 for r in range(world)],
            "pp": [(r // 2) % 2 for r in range(world)],
            "tp": [r % 2 for r in range(world)],
            "host": ["h"] * world,
        }
    ).set_index("rank")


def transfer_frame(slow_group: int | None) -> pd.DataFrame:
    """4 TP pairs (0,1) (2,3) (4,5) (6,7) x 10 steps; ``slow_group``'s link is slow."""
    return pd.DataFrame(
        [{"group_id": f"tp{g}", "step": step, "instances": 4, "skew_mean": 0.1 * MS, "step_bytes": 4096,
          "transfer_mean": (12 if g == slow_group else 1 + 0.1 * np.sin(g + step)) * MS}
         for g in range(4) for step in range(10)]
    )  # fmt: skip


GROUPS = pd.DataFrame(
    [{"group_id": f"tp{g}", "group_ranks": f"{2 * g},{2 * g + 1}"} for g in range(4)]
)
AXES = {f"tp{g}": "tp" for g in range(4)}


def test_slow_tp_group_is_found_with_low_skew():
    found = slow_comm_findings(
        transfer_frame(2), GROUPS, AXES, coords(), step_ms=100.0, steps=range(1, 10)
    )
    assert len(found) == 1
    f = found[0]
    assert (f.kind, f.cause) == ("slow_communication", "communication")
    assert f.culprit_rank == -1 and f.evidence["shared_ranks"] == [4, 5]
    assert f.evidence["slow_groups"][0]["transfer_ms"] == 12.0
    assert 40 < f.impact_pct < 50  # 4 collectives x ~11 ms extra per 100 ms step


def test_even_groups_are_not_slow():
    assert (
        slow_comm_findings(transfer_frame(None), GROUPS, AXES, coords(), 100.0, range(1, 10)) == []
    )


def test_set_up_and_unfinished_steps_are_not_a_links_speed():
    """A crashed rank's TP peer errors out of their collectives in the step that never
    ended, and set-up collectives (step -1) are slow everywhere by chance: neither counts.
    Here group tp3 is slow at -1, 0 (warm-up), 2 and 5 (the crash step): 1 of the 4
    analyzed steps (1-4)."""
    frame = transfer_frame(None)
    frame = frame[frame["step"] <= 5]
    extra = [{"group_id": f"tp{g}", "step": -1, "instances": 4, "skew_mean": 0.1 * MS,
              "step_bytes": 4096, "transfer_mean": 1 * MS} for g in range(4)]  # fmt: skip
    frame = pd.concat([frame, pd.DataFrame(extra)], ignore_index=True)
    slow_at = frame["group_id"].eq("tp3") & frame["step"].isin([-1, 0, 2, 5])
    frame.loc[slow_at, "transfer_mean"] = 12 * MS
    assert slow_comm_findings(frame, GROUPS, AXES, coords(), 100.0, range(1, 5)) == []
    (every,) = slow_comm_findings(frame, GROUPS, AXES, coords(), 100.0, range(-1, 6))
    assert every.evidence["shared_ranks"] == [6, 7]


def test_two_slow_steps_of_four_are_noise_three_a_slow_link():
    """A run cut short after 4 analyzed steps: a group slow in 2 of them is half, but two
    noisy steps on a shared host are not a link; 3 of 4 are."""
    for slow_steps, found in (([1, 3], False), ([1, 2, 4], True)):
        frame = transfer_frame(None)
        frame = frame[frame["step"] <= 4].copy()
        frame.loc[frame["group_id"].eq("tp1") & frame["step"].isin(slow_steps), "transfer_mean"] = (
            12 * MS
        )
        got = slow_comm_findings(frame, GROUPS, AXES, coords(), 100.0, range(1, 5))
        assert [f.evidence["shared_ranks"] for f in got] == ([[2, 3]] if found else [])


def test_desync_names_the_odd_rank():
    mism = pd.DataFrame(
        [
            {
                "group_id": "dp0",
                "group_seq": 7,
                "members": "0,4,8",
                "ranks_list": [0, 4, 8],
                "ops_list": ["all_reduce"] * 3,
                "sizes_list": [1024, 512, 1024],
                "dtypes_list": ["float32"] * 3,
                "n_ops": 1,
                "n_sizes": 2,
                "n_dtypes": 1,
            }
        ]
    )
    found = desync_findings(mism, coords(12))
    assert [f.culprit_rank for f in found] == [4]
    assert found[0].kind == "desync" and found[0].evidence["seq"] == 7


def test_nan_onset_ignores_ranks_without_loss():
    rows = []
    for step in range(10):
        rows.append({"rank": 6, "step": step, "loss": 3.0 if step < 5 else np.nan})
        rows.append({"rank": 7, "step": step, "loss": 3.0})
        rows.append({"rank": 0, "step": step, "loss": np.nan})  # first stage: no loss
    found = nan_findings(pd.DataFrame(rows), coords())
    assert [(f.culprit_rank, f.evidence["first_bad_step"]) for f in found] == [(6, 5)]


def test_desync_in_a_group_of_two_names_the_rank_off_the_usual_signature():
    # rank 4 resized: one against one at seq 9; the group issued 65536 elements all run
    mism = pd.DataFrame(
        [
            {"group_id": "tp2", "group_seq": 9, "members": "4,5", "ranks_list": [4, 5],
             "ops_list": ["all_reduce"] * 2, "sizes_list": [65537, 65536],
             "dtypes_list": ["float32"] * 2, "n_ops": 1, "n_sizes": 2, "n_dtypes": 1}
        ]
    )  # fmt: skip
    usual = pd.DataFrame(
        {"group_id": ["tp2", "tp2"], "op": ["all_reduce"] * 2, "size": [65536, 65537],
         "dtype": ["float32"] * 2, "n": [40, 1]}
    )  # fmt: skip
    assert [f.culprit_rank for f in desync_findings(mism, coords(8))] == [5]  # a coin toss
    found = desync_findings(mism, coords(8), usual)
    assert [f.culprit_rank for f in found] == [4]
    assert found[0].evidence["signatures"]["4"]["numel"] == 65537


def test_a_crash_or_hang_a_desync_explains_is_folded_into_it() -> None:
    from ranksight.analyzer.findings import Finding
    from ranksight.analyzer.folds import with_crash as _with_crash
    from ranksight.analyzer.folds import with_hang as _with_hang

    def finding(kind: str, rank: int, summary: str, **evidence) -> Finding:
        return Finding(kind, "unknown", rank, "h", 0, 0, 0, 0.9, 0.0, summary, evidence)

    desync = finding("desync", 3, "rank 3 issued all_gather #7", members="2,3")
    crash = finding("crash", 2, "rank 2 died", detail="exit code 1")
    (folded,), notes = _with_crash([desync], crash)
    assert notes == []
    assert folded.evidence["then_crashed"] == {"rank": 2, "detail": "exit code 1"}
    assert (
        folded.summary == "rank 3 issued all_gather #7; then rank 2's process ended (exit code 1)"
    )
    outside = finding("crash", 5, "rank 5 died", detail="exit code 1")
    assert [f.kind for f in _with_crash([desync], outside)[0]] == ["crash", "desync"]
    hang = finding("hang", -1, "every rank blocked", stalled_s=61.4)
    (folded,) = _with_hang([desync], hang)
    assert folded.evidence["then_hung"] == {"stalled_s": 61.4}
    assert folded.summary.endswith("; the job then hung (61 s without a step)")
    rooted = finding("hang", 1, "rank 1 never entered", stalled_s=5)
    assert [f.kind for f in _with_hang([desync], rooted)] == ["hang", "desync"]


def test_a_mismatch_issued_after_a_member_died_is_the_crash_not_a_desync() -> None:
    """Shaped like the CI failure on Lightning on gloo with rank 1 SIGKILLed: after the
    kill, the live ranks disagreed at #68 (which op each issued there was not in the
    output; here 0 and 3 issue a barrier and 2 an all_reduce, all after rank 1's end).
    The crash leads; the mismatch is a note. A rank that issued an odd collective and
    then died is still the desync's."""
    from ranksight.analyzer.findings import Finding
    from ranksight.analyzer.folds import with_crash as _with_crash

    mism = pd.DataFrame(
        [
            {"group_id": "g0", "group_seq": 68, "members": "0,1,2,3", "ranks_list": [0, 2, 3],
             "ops_list": ["barrier", "all_reduce", "barrier"], "sizes_list": [1, 266760, 1],
             "dtypes_list": ["float32"] * 3, "issued_list": [5_300, 4_100, 5_200],
             "n_ops": 2, "n_sizes": 2, "n_dtypes": 1}
        ]
    )  # fmt: skip
    (desync,) = desync_findings(mism, coords(4))
    assert desync.culprit_rank == 2
    crash = Finding("crash", "gone", 1, "h", 0, 0, 0, 0.9, 100.0, "rank 1 died",
                    {"detail": "SIGKILL", "ended_ns": 5_000})  # fmt: skip
    found, notes = _with_crash([desync], crash)
    assert [f.kind for f in found] == ["crash"]
    assert notes and "rank(s) 0, 3 issued g0 #68" in notes[0]
    before = replace(crash, evidence={**crash.evidence, "ended_ns": 6_000})  # died after
    (folded,), notes = _with_crash([desync], before)
    assert folded.kind == "desync" and "then_crashed" in folded.evidence and notes == []
    odd = replace(crash, culprit_rank=2)  # the odd rank itself died
    (folded,), _ = _with_crash([desync], odd)
    assert folded.kind == "desync" and folded.evidence["then_crashed"]["rank"] == 2


def test_a_pairs_bucket_counts_only_when_wholly_inside_the_analyzed_steps():
    """TRANSFER_P2P buckets steps (a long run: ``step`` is the bucket's first). A bucket
    that holds a warm-up step or the step a crashed job never finished is left out, as
    the collective groups' own steps are."""
    from ranksight.analyzer.detectors.slow_comm import _within

    pairs = [{"group_id": "pp:2>0", "step": b, "transfer_mean": 1.0} for b in (0, 5, 10, 15, 20)]
    colls = [{"group_id": "tp0", "step": s, "transfer_mean": 1.0} for s in range(25)]
    frame = pd.DataFrame(pairs + colls)
    got = _within(frame, range(1, 23))
    assert sorted(got.loc[got["group_id"] == "pp:2>0", "step"]) == [5, 10, 15]
    assert sorted(got.loc[got["group_id"] == "tp0", "step"]) == list(range(1, 23))
    assert _within(frame, []).empty


def test_a_link_slow_from_a_late_step_carries_that_onset_for_its_before_after():
    frame = transfer_frame(None)
    late = frame["group_id"].eq("tp1") & (frame["step"] >= 4)
    frame.loc[late, "transfer_mean"] = 12 * MS
    (f,) = slow_comm_findings(frame, GROUPS, AXES, coords(), 100.0, range(0, 10))
    assert f.evidence["onset_step"] == 4
    assert f.evidence["slow_groups"][0]["onset_step"] == 4


def test_a_pairs_onset_is_read_over_its_own_buckets_not_the_empty_steps_between():
    """Pair buckets (every 2nd step here) leave the steps between them empty in the
    group x step matrix, which a collective group fills: the run of slow buckets from
    step 6 is the onset, though no 3 columns in a row are slow."""
    from ranksight.analyzer.detectors.slow_comm import find_slow_groups

    row = {"instances": 4, "skew_mean": 0.1 * MS, "step_bytes": 4096}
    pairs = [{**row, "group_id": g, "step": b,
              "transfer_mean": (12 if g == "pp:2>0" and b >= 6 else 1) * MS}
             for g in ("pp:2>0", "pp:3>1") for b in range(0, 20, 2)]  # fmt: skip
    colls = [{**row, "group_id": "tp0", "step": s, "transfer_mean": 1 * MS} for s in range(20)]
    (g,) = find_slow_groups(pd.DataFrame(pairs + colls), {"pp:2>0": "pp", "pp:3>1": "pp",
                            "tp0": "tp"}, {"pp:2>0": [2, 0], "pp:3>1": [3, 1]})  # fmt: skip
    assert (g.group_id, g.onset_step) == ("pp:2>0", 6)


def test_a_finding_carries_mesh_axes_beyond_dp_tp_pp_through_the_store_row() -> None:
    """A rank's cp/ep coordinates ride on its finding and survive the findings table's
    row (dp, tp, pp columns; the rest in evidence_json); a finding without them is as
    before."""
    from ranksight.analyzer.findings import Finding, finding_at
    from ranksight.ground.vocab import Cause, Kind

    coords = pd.DataFrame(
        {"dp": [0, 1], "tp": [0, 0], "pp": [1, 1], "cp": [0, 1], "ep": [2, 3], "host": "n0"}
    ).set_index(pd.Index([0, 1]))
    f = finding_at(Kind.STRAGGLER, Cause.COMPUTE, 1, coords, confidence=0.5, impact_pct=1.0,
                   summary="s", evidence={"a": 1})  # fmt: skip
    assert f.axes == {"cp": 1, "ep": 3}
    assert f.coords() == {"dp": 1, "tp": 0, "pp": 1, "cp": 1, "ep": 3}
    row = f.to_row("r", 0, 1, 0)
    assert (row["dp"], row["tp"], row["pp"]) == (1, 0, 1) and "axes" not in row
    assert Finding.from_row(row) == f
    plain = finding_at(Kind.NAN, Cause.NUMERICS, 0, coords[["dp", "tp", "pp", "host"]],
                       confidence=0.9, impact_pct=100.0, summary="n")  # fmt: skip
    assert plain.axes == {} and Finding.from_row(plain.to_row("r", 0, 1, 1)) == plain
    assert "mesh_axes" not in plain.to_row("r", 0, 1, 1)["evidence_json"]


def test_a_rank_that_died_inside_the_mismatched_collective_died_of_the_desync() -> None:
    """Shaped like the fault matrix's desync-resize run (gloo, tp group 4,5): rank 5's
    recorded end is the last moment it was seen, its own enqueue of #282; rank 4 issued
    the resized #282 (65,537 elements against 65,536) 22 ms after that, and the mismatch
    aborted rank 5. It took part in #282: the desync leads, the crash is its consequence."""
    from ranksight.analyzer.findings import Finding
    from ranksight.analyzer.folds import with_crash as _with_crash

    mism = pd.DataFrame(
        [
            {"group_id": "g2", "group_seq": 282, "members": "4,5", "ranks_list": [4, 5],
             "ops_list": ["all_reduce", "all_reduce"], "sizes_list": [65537, 65536],
             "dtypes_list": ["float32"] * 2, "issued_list": [22_000_000, 0],
             "n_ops": 1, "n_sizes": 2, "n_dtypes": 1}
        ]
    )  # fmt: skip
    (desync,) = desync_findings(mism, coords(8))
    crash = Finding("crash", "signal", 5, "h", 1, 1, 0, 0.95, 100.0, "rank 5 died",
                    {"detail": "killed by SIGABRT", "ended_ns": 0})  # fmt: skip
    crash = replace(crash, evidence={**crash.evidence, "ended_ns": 1})  # seen last at #282
    (folded,), notes = _with_crash([desync], crash)
    assert folded.kind == "desync" and folded.evidence["then_crashed"]["rank"] == 5
    assert notes == []
