"""Crash findings from how ranks ended (analyzer/detectors/crash.py) and torchrun's summary."""

from __future__ import annotations

import pandas as pd

from ranksight.analyzer.detectors.crash import crash_finding, find_crash
from ranksight.importer.torchrun_log import rank_end_rows, torchrun_failures

S = 1_000_000_000
SUMMARY = """
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-29_20:34:12
  host      : node-a
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 30546)  (SIGTERM)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 30546
[2]:
  time      : 2026-11-29_20:34:12
  host      : node-a
  rank      : 1 (local_rank: 1)
  exitcode  : 1 (pid: 30547)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-29_20:34:11
  host      : node-b
  rank      : 3 (local_rank: 1)
  exitcode  : -6 (pid: 30552)  (SIGABRT)
  error_file: <N/A>
  traceback : Signal 6 (SIGABRT) received by PID 30552
============================================================
"""


def _ends(rows):
    cols = ["rank", "source", "reason", "code", "detail", "last_step", "ts_ns"]
    return pd.DataFrame(rows, columns=cols)


def _coords(n=4):
    return pd.DataFrame(
        {"dp": [r // 2 for r in range(n)], "tp": [r % 2 for r in range(n)], "pp": [0] * n,
         "host": ["h"] * n},
        index=pd.Index(range(n), name="rank"),
    )  # fmt: skip


def test_torchrun_summary_root_cause_first_with_codes_and_hosts():
    f = torchrun_failures(SUMMARY)
    assert [(x["rank"], x["exitcode"], x["root_cause"], x["host"]) for x in f] == [
        (3, -6, True, "node-b"),
        (0, -15, False, "node-a"),
        (1, 1, False, "node-a"),
    ]
    rows = rank_end_rows(f, "r", 2)
    assert rows[0]["detail"] == "root cause (first observed failure); killed by SIGABRT"
    assert rows[1]["detail"] == "killed by SIGTERM" and rows[2]["detail"] == ""
    assert {r["source"] for r in rows} == {"launcher"} and {r["attempt"] for r in rows} == {2}
    assert torchrun_failures("Traceback: nothing of the sort") == []


def test_a_rank_killed_outright_is_the_one_whose_records_stopped_first():
    # rank 2 recorded nothing (os._exit / SIGKILL); 3 failed after it; 0 and 1 were stopped
    ends = _ends(
        [
            (3, "hooks", "exception", -1, "RuntimeError: Connection closed by peer", 5, 31 * S),
            (0, "hooks", "signal", 15, "SIGTERM", 5, 32 * S),
            (1, "hooks", "signal", 15, "SIGTERM", 5, 32 * S),
        ]
    )
    seen = pd.Series({0: 32 * S, 1: 32 * S, 2: 29 * S, 3: 31 * S})
    box = (2, "agent", "gone", -1, "the process ended without recording its end", 6, 30 * S)
    ends = pd.concat([ends, _ends([box])], ignore_index=True)
    report = find_crash(ends, seen, pd.Series({0: 5, 1: 5, 2: 5, 3: 5}), "failed")
    assert report.culprit.rank == 2 and report.culprit.how == "gone"
    assert report.culprit.last_step == 6 and report.culprit.at_ns == 30 * S  # its black box
    assert report.victims == [0, 1, 3]
    f = crash_finding(report, _coords(), pd.DataFrame(), pd.DataFrame())
    assert (f.kind, f.cause, f.culprit_rank, f.impact_pct) == ("crash", "gone", 2, 100.0)
    assert f.evidence["others"] == {"failed after it": [3], "stopped by the launcher": [0, 1]}
    assert "rank 2 (dp=1, tp=0, pp=0, host h) failed first" in f.summary


def test_the_launchers_root_cause_wins_and_gives_the_exit_code():
    ends = _ends(
        [
            (2, "launcher", "exit_code", 17, "root cause (first observed failure)", -1, 40 * S),
            (0, "launcher", "exit_code", -15, "killed by SIGTERM", -1, 40 * S),
            (0, "hooks", "signal", 15, "SIGTERM", 5, 32 * S),
            (1, "hooks", "exception", -1, "RuntimeError: Connection closed", 5, 29 * S),
        ]
    )
    seen = pd.Series({0: 32 * S, 1: 29 * S, 2: 30 * S, 3: 32 * S})
    report = find_crash(ends, seen, pd.Series({2: 5}), "failed")
    assert report.culprit.rank == 2 and report.culprit.code == 17
    progress = pd.DataFrame(
        {"rank": [2, 2], "group_id": ["g1", "g2"], "issued": [9, 4], "completed": [8, 3],
         "op": ["all_reduce", "send"], "members": ["2,3", "0,2"], "direction": ["", "send"]}
    )  # fmt: skip
    stacks = pd.DataFrame({"rank": [2], "crash_stack": ["Fatal Python error: Aborted ..."]})
    f = crash_finding(report, _coords(), progress, stacks)
    assert f.cause == "exit_code" and "exited with code 17" in f.summary
    assert "in step 5 inside all_reduce #9" in f.summary
    assert f.evidence["inflight"] == [
        {"group_id": "g1", "op": "all_reduce", "seq": 9, "members": "2,3"}
    ]
    assert f.evidence["crash_stack"].startswith("Fatal Python error")


def test_an_exit_code_without_records_takes_the_step_from_the_black_box():
    """``os._exit(17)`` in step 6 (recorded on 2 H200s): the hooks' records of step 5 never
    left the process, the launcher gives only the code, and the black box, read by the
    agent after the process was gone, has the step it was in."""
    ends = _ends(
        [
            (1, "agent", "gone", -1, "", 6, 31 * S),
            (1, "launcher", "exit_code", 17, "root cause (first observed failure)", -1, 40 * S),
            (0, "launcher", "exit_code", -15, "killed by SIGTERM", -1, 40 * S),
            (0, "hooks", "signal", 15, "SIGTERM", 6, 33 * S),
        ]
    )
    seen = pd.Series({0: 33 * S, 1: 30 * S})
    report = find_crash(ends, seen, pd.Series({0: 6, 1: 4}), "failed")
    e = report.culprit
    assert (e.rank, e.how, e.code, e.last_step, e.at_ns) == (1, "exit_code", 17, 6, 31 * S)
    f = crash_finding(report, _coords(2), pd.DataFrame(), pd.DataFrame())
    assert "exited with code 17 without an exception in step 6;" in f.summary


def test_an_uncaught_exception_is_named_with_its_message():
    ends = _ends(
        [
            (1, "hooks", "exception", -1, "ValueError: bad batch shape", 3, 10 * S),
            (0, "hooks", "signal", 15, "SIGTERM", 3, 11 * S),
        ]
    )
    report = find_crash(ends, pd.Series({0: 11 * S, 1: 10 * S}), pd.Series(dtype=int), "failed")
    f = crash_finding(report, _coords(2), pd.DataFrame(), pd.DataFrame())
    assert (f.culprit_rank, f.cause) == (1, "exception")
    assert "raised ValueError: bad batch shape" in f.summary


def test_no_crash_in_a_clean_run_a_cancelled_run_or_a_live_run_without_ends():
    clean = _ends([(r, "hooks", "finished", 0, "", 9, 10 * S) for r in range(4)])
    seen = pd.Series({r: 10 * S for r in range(4)})
    assert find_crash(clean, seen, pd.Series(dtype=int), "failed") is None
    stopped = _ends([(r, "hooks", "signal", 15, "SIGTERM", 9, 10 * S) for r in range(4)])
    assert find_crash(stopped, seen, pd.Series(dtype=int), "failed") is None  # cancelled
    assert find_crash(_ends([]), seen, pd.Series(dtype=int), "running") is None
    assert find_crash(clean, seen, pd.Series(dtype=int), "finished") is None
