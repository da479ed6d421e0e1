"""Hang localization from progress snapshots (pure, synthetic frames)."""

from __future__ import annotations

import pandas as pd
import pytest

from ranksight.analyzer.detectors.hang import HangConfig, find_hang, hang_finding

S = 1_000_000_000


def snap(rank, group, members, issued, completed, seen_s, direction="", peer=-1, op="all_reduce"):
    return {
        "rank": rank,
        "group_id": group,
        "direction": direction,
        "peer": peer,
        "issued": issued,
        "completed": completed,
        "op": op,
        "members": members,
        "seen_ns": seen_s * S,
        "at_step": 5,
    }


def coords():
    return pd.DataFrame(
        {"rank": range(4), "dp": [0, 0, 1, 1], "tp": [0, 1, 0, 1], "pp": [0] * 4, "host": ["h"] * 4}
    ).set_index("rank")


def test_rank_that_never_entered_is_the_root():
    # TP group {0,1}: rank 0 blocked in seq 7, rank 1 issued only 6; DP group {0,2}: fine;
    # rank 2 blocked in DP all_reduce #3 waiting for rank 0 (which is itself blocked).
    latest = pd.DataFrame(
        [
            snap(0, "tp0", "0,1", 7, 6, 100),
            snap(1, "tp0", "0,1", 6, 6, 100),
            snap(0, "dp0", "0,2", 2, 2, 100),
            snap(2, "dp0", "0,2", 3, 2, 100),
        ]
    )
    report = find_hang(latest, last_step_end_ns=60 * S)
    assert report is not None and report.roots == [1] and report.gone == []
    assert sorted(report.blocked) == [0, 2]
    f = hang_finding(report, coords())
    assert (f.kind, f.cause, f.culprit_rank, f.tp) == ("hang", "stuck", 1, 1)
    assert f.evidence["waiting_on_root"][0]["blocked_ranks"] == [0]
    assert "never entered all_reduce #7" in f.summary


def test_p2p_wait_points_at_the_sender():
    latest = pd.DataFrame(
        [
            snap(2, "pp", "0,2", 4, 3, 100, direction="recv", peer=0, op="recv"),
            snap(0, "pp", "0,2", 3, 3, 100, direction="send", peer=2, op="send"),
        ]
    )
    report = find_hang(latest, last_step_end_ns=70 * S)
    assert report.roots == [0] and report.waits[0]["kind"] == "p2p"


def test_dead_rank_is_a_crash():
    latest = pd.DataFrame(
        [
            snap(0, "tp0", "0,1", 7, 6, 100),
            snap(1, "tp0", "0,1", 6, 6, 80),
        ]
    )
    f = hang_finding(find_hang(latest, last_step_end_ns=70 * S), coords())
    assert (f.kind, f.culprit_rank, f.cause) == ("crash", 1, "crash")


def test_progressing_run_is_not_hung():
    latest = pd.DataFrame([snap(0, "tp0", "0,1", 7, 6, 100), snap(1, "tp0", "0,1", 6, 6, 100)])
    assert find_hang(latest, last_step_end_ns=95 * S) is None  # a step ended 5 s ago
    done = pd.DataFrame([snap(0, "tp0", "0,1", 7, 7, 100), snap(1, "tp0", "0,1", 7, 7, 100)])
    assert find_hang(done, last_step_end_ns=10 * S) is None  # nothing blocked, no one gone


def test_config_validation():
    with pytest.raises(ValueError):
        HangConfig(stall_s=0)


def test_every_rank_inside_the_stuck_op_has_no_single_culprit():
    latest = pd.DataFrame([snap(0, "tp0", "0,1", 7, 6, 100), snap(1, "tp0", "0,1", 7, 6, 100)])
    f = hang_finding(find_hang(latest, last_step_end_ns=60 * S), coords())
    assert (f.kind, f.culprit_rank, f.cause) == ("hang", -1, "all_blocked")


def test_a_send_that_never_completed_waits_for_the_peer_that_never_posted_its_recv():
    # rank 2 (pipeline stage 1) hangs outside communication; rank 0 is blocked in its DP
    # all_reduce waiting for rank 1, and rank 1 only has a pipeline send to rank 3 pending
    # (rank 3 never posted the recv): the root is rank 3, not rank 1
    latest = pd.DataFrame(
        [
            snap(0, "dp", "0,1", 15, 14, 100),
            snap(1, "dp", "0,1", 14, 14, 100),
            snap(1, "pp", "1,3", 23, 22, 100, direction="send", peer=3, op="send"),
            snap(3, "pp", "1,3", 22, 22, 100, direction="recv", peer=1, op="recv"),
        ]
    )
    report = find_hang(latest, last_step_end_ns=70 * S)
    assert report.roots == [3]
    assert {(e["waiter"], e["holder"], e["kind"]) for e in report.waits} == {
        (0, 1, "collective"),
        (1, 3, "p2p"),
    }


def test_a_hang_names_each_group_by_its_axis_and_ranks_in_the_report(tmp_path):
    """The report says where each blocked rank waits as an engineer says it ("all_reduce
    #5 (dp group of ranks 3,7)"), not as raw JSON of group hashes."""
    from ranksight import report as rep
    from ranksight.analyzer import analyze
    from ranksight.store import open_store
    from ranksight.synthetic import SynthConfig, write_synthetic

    store = open_store(str(tmp_path / "store"))
    store.init_schema()
    cfg = SynthConfig(
        dp=2, tp=2, pp=2, steps=12, run_id="hang", faults=("hang:rank=3,from_step=5",)
    )
    write_synthetic(store, cfg)
    [f] = analyze(store, "hang", save=False).findings
    assert (f.kind, f.culprit_rank) == ("hang", 3)
    assert "of the dp group of ranks 3,7" in f.summary and "7 ranks (0-2,4-7)" in f.summary
    assert {e["group"] for e in f.evidence["waiting_on_root"]} == {
        "dp group of ranks 3,7", "tp group of ranks 2,3", "pp group of ranks 1,3"
    }  # fmt: skip
    lines = dict(rep._evidence_lines(f))
    assert lines["waiting_on_root"].startswith("rank 7 in all_reduce #5 (dp group of ranks 3,7); ")
    assert "rank 1 in recv #10 (pp group of ranks 1,3)" in lines["waiting_on_root"]
    assert (
        "group_id" not in lines["blocked"]
        and "rank 5 in all_reduce #5 (dp group of ranks 1,5)" in lines["blocked"]
    )
    assert lines["roots"] == "3"


def test_stacks_in_the_report_are_the_main_threads_grouped_by_where_they_wait():
    from ranksight.report import _evidence_lines

    waiting = (
        "MainThread (1) idle: wait (waits.py:30) <- all_reduce (c10d.py:3252) <- step (train.py:9)"
    )
    f = hang_finding(
        *_stuck_with_stacks(
            {0: waiting, 2: waiting},
            "MainThread (9) idle: Event.wait (threading.py:629) <- Hang.before_compute (inject_comm.py:351)",
        )
    )
    assert f.evidence["culprit_stack"].startswith("MainThread (9)")
    lines = dict(_evidence_lines(f))
    assert (
        lines["culprit_stack"]
        == "Event.wait (threading.py:629) <- Hang.before_compute (inject_comm.py:351)"
    )
    assert (
        lines["blocked_stacks"]
        == "ranks 0,2: wait (waits.py:30) <- all_reduce (c10d.py:3252) <- step (train.py:9)"
    )


def _stuck_with_stacks(blocked_stacks: dict[int, str], own: str):
    latest = pd.DataFrame(
        [snap(0, "tp0", "0,1", 7, 6, 100), snap(1, "tp0", "0,1", 6, 6, 100),
         snap(0, "dp0", "0,2", 2, 2, 100), snap(2, "dp0", "0,2", 3, 2, 100)]
    )  # fmt: skip
    report = find_hang(latest, last_step_end_ns=60 * S)
    stacks = pd.DataFrame(
        [{"rank": r, "stack_summary": t} for r, t in {**blocked_stacks, 1: own}.items()]
    )
    return report, coords(), None, {}, stacks
