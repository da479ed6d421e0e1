"""The seventh batch of real posted logs (``tests/data/realworld/bk7-*``, sources in
``bk7-INDEX.md``): launcher and scheduler lines that were skipped, asserted on the
reading itself, beyond the corpus verdict that ``test_realworld.py`` checks."""

from __future__ import annotations

from ranksight.importer.logs import read_lines
from tests.helpers.realworld import case_findings


def test_mpiruns_and_horovodruns_first_failure_names_the_rank() -> None:
    """Aware-of-the-history#2 ('mpirun noticed that process rank 1 ... exited on signal 9
    (Killed)'), horovod#3472 ('Process 0 exit with status code 137.'), determined#3275
    (Horovod's 'The first process to do so was:' block, its exit code before its name).
    All three were skipped as saying nothing."""
    for case, rank, cause in (("bk7-mpirun-rank1-sigkill", 1, "signal"),
                              ("bk7-hvd3472-exit137", 0, "signal"),
                              ("bk7-determined-hvd-137", 1, "exit_code")):  # fmt: skip
        (f, *_) = case_findings(case)[0]
        assert (f.kind, f.culprit_rank, f.cause) == ("crash", rank, cause), case
    (e,) = read_lines(["The first process to do so was:", "  Process name: [[62389,1],3]",
                       "  Exit code:    7"])  # fmt: skip
    assert (e.kind, e.rank, e.code, e.detail["source"]) == ("child_failed", 3, 7, "mpirun")


def test_an_agents_death_signal_with_no_failure_before_it_is_a_stop_from_outside() -> None:
    """nvidia-resiliency-ext#18: six agents 'Received 15 death signal, shutting down
    workers' and close their workers with SIGTERM; nothing failed first. Skipped."""
    (f,) = case_findings("bk7-nvrx-sigterm-agents")[0]
    assert (f.kind, f.cause, f.culprit_rank, f.evidence["signals"]) == (
        "crash", "signal", -1, ["SIGTERM"])  # fmt: skip
    (e,) = read_lines(["[WARNING] Received Signals.SIGTERM death signal, shutting down workers"])
    assert e.detail["signal"] == "SIGTERM"


def test_srun_says_which_tasks_failed_first_and_when_memory_ran_out() -> None:
    """desihub/redrock#100: tasks 'Aborted' before the ones srun 'Terminated'; brain-score
    vision#950: 'task 0: Out Of Memory' and slurmstepd's 'Detected 1 oom-kill event(s)'
    (read as a crash of the step's set-up, 'many tasks failing at once')."""
    import pandas as pd

    from ranksight.analyzer.log_evidence import log_findings

    coords = pd.DataFrame(columns=["dp", "tp", "pp", "host"])
    lines = ["srun: error: nid00160: tasks 1408-1418: Aborted",
             "srun: error: nid00181: tasks 1856,1858: Terminated"]  # fmt: skip
    (f,) = log_findings(pd.DataFrame([e.row() for e in read_lines(lines)]), coords)[0]
    assert "1408-1418 Aborted" in f.summary and "1856" not in f.summary
    assert "terminated after it" in f.summary and f.host == "nid00160"
    oom = ["slurmstepd: error: Detected 1 oom-kill event(s) in StepId=37205392.0.",
           "srun: error: node107: task 0: Out Of Memory"]  # fmt: skip
    (g,) = log_findings(pd.DataFrame([e.row() for e in read_lines(oom)]), coords)[0]
    assert (g.cause, g.host) == ("out_of_memory", "node107")


def test_an_ofi_warning_while_a_communicator_aborts_is_no_network_fault() -> None:
    """aws-k8s-tester#524: ``NET/OFI Attempt to call recv_close with outstanding
    requests!`` beside 'Abort COMPLETE' lines: tear-down only (it said 'network: rank 16')."""
    assert case_findings("bk7-k8s-mpijob-bert")[0] == []
