"""How a framework job stops, told right: a SIGSTOPped rank is a hang (it is alive:
the agent reads state T), not a crash (on real jobs: ``tests/e2e/test_frameworks_faults.py``);
a clean exit whose last records are still on the way is no crash, and an interpreter exit
is worded as the clean end it is; a job that died before the hooks attached is not clean
when the launcher saw it fail."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest

from ranksight.agent.stall import StallWatcher, stopped_state
from ranksight.analyzer.detectors.crash import CLEAN_EXIT, crash_finding, find_crash
from ranksight.collectors.base import NodeContext
from ranksight.collectors.local_ranks import LocalRank
from tests.helpers.frameworks import Job, described, torchrun

S = 1_000_000_000


def _ends(rows):
    cols = ["rank", "source", "reason", "code", "detail", "last_step", "ts_ns"]
    return pd.DataFrame(rows, columns=cols)


def test_the_agent_sees_a_stopped_rank_and_when_it_runs_again(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        watcher = StallWatcher(NodeContext(host="n1", spool_dir=str(tmp_path)))
        rank = LocalRank("run-s", 0, 1, proc.pid, str(tmp_path / "rank1"))
        assert watcher.state_changes([rank], 1) == [] and stopped_state(proc.pid) == ""
        os.kill(proc.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 10
        while not stopped_state(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        rows = watcher.state_changes([rank], 2)
        assert [(r["rank"], r["trigger"], r["ok"], r["ts_ns"]) for r in rows] == [
            (1, "stopped", 0, 2)
        ]
        assert rows[0]["summary"].startswith("state T")
        assert watcher.state_changes([rank], 3) == [], "once per stop"
        os.kill(proc.pid, signal.SIGCONT)
        time.sleep(0.3)
        assert [r["trigger"] for r in watcher.state_changes([rank], 4)] == ["continued"]
    finally:
        proc.kill()
        proc.wait()
    assert stopped_state(proc.pid) == "", "a process that is gone is not stopped"


def test_a_clean_exit_whose_last_records_are_on_the_way_is_no_crash():
    clean = _ends([(r, "hooks", "exit", -1, "interpreter exit", 117, 100 * S) for r in (0, 2, 3)])
    seen = pd.Series({0: 100 * S, 1: 99 * S, 2: 100 * S, 3: 100 * S})
    steps = pd.Series({r: 117 for r in range(4)})
    assert find_crash(clean, seen, steps, "running") is None  # rank 1's end not stored yet
    report = find_crash(clean, seen, steps, "failed")  # the job is over: rank 1 never ended
    assert report is not None and report.culprit.rank == 1
    box = _ends([(1, "agent", "gone", -1, "the process ended without recording its end", 117,
                  99 * S)])  # fmt: skip
    report = find_crash(pd.concat([clean, box]), seen, steps, "running")
    assert report is not None and report.culprit.rank == 1, "the agent saw its process end"


def test_an_interpreter_exit_is_worded_as_the_clean_end_it_is():
    rows = [(r, "hooks", "exit", -1, "interpreter exit without hooks.close()", 40, 100 * S)
            for r in (0, 2, 3)]  # fmt: skip
    killed = [(1, "launcher", "exit_code", -9, "signal 9 (SIGKILL); root cause", 20, 90 * S)]
    seen = pd.Series({0: 100 * S, 1: 90 * S, 2: 100 * S, 3: 100 * S})
    steps = pd.Series({r: 40 for r in range(4)})
    report = find_crash(_ends(rows + killed), seen, steps, "failed")
    assert report is not None and report.culprit.rank == 1
    found = crash_finding(report, pd.DataFrame(), pd.DataFrame(), pd.DataFrame())
    assert f"3 rank(s) {CLEAN_EXIT}" in found.summary, found.summary
    assert {found.evidence["ends"][r]["detail"] for r in "023"} == {CLEAN_EXIT}
    # sys.exit(1) also ends at interpreter exit: the launcher's exit code says it failed
    failed = [(1, "hooks", "exit", -1, "interpreter exit without hooks.close()", 20, 90 * S),
              (1, "launcher", "exit_code", 1, "exit code 1; root cause", 20, 90 * S)]  # fmt: skip
    report = find_crash(_ends(rows + failed), seen, steps, "failed")
    assert report is not None and report.culprit.how == "exit_code"
    assert "exited with code 1" in crash_finding(report, pd.DataFrame(), pd.DataFrame(),
                                                 pd.DataFrame()).summary  # fmt: skip


@pytest.mark.training
def test_a_job_that_died_before_attaching_is_a_crash_not_a_clean_run(tmp_path):
    job = Job(str(tmp_path), torchrun(2, "ddp_job.py", "not-a-number"))
    assert job.wait() != 0, job.output[-2000:]
    found = job.analysis(save=True).findings
    assert [(f.kind, f.cause) for f in found] == [("crash", "exit_code")], described(found)
    assert found[0].culprit_rank in (0, 1) and "exited with code 2" in found[0].summary
