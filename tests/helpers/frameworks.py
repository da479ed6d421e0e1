"""Running a real framework's training job under ``ranksight launch`` for the framework
tests (``tests/e2e/test_frameworks*.py``) and ``bench/frameworks_faults.py``: start it, find
its ranks, inject a fault from outside (``tests/helpers/outside_faults.py``), poll the analysis
until it names what was injected (time to detection), and read what was stored.

The matrix: every trainer of :data:`FRAMEWORKS` with every fault of :data:`FAULTS`, one
short job each, run by :func:`run_case` and judged the same way for all."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import pandas as pd

from ranksight.ground import env
from ranksight.store import open_store
from tests.helpers.outside_faults import kill_tree, rank_process, slowed

WORKERS = os.path.join(os.path.dirname(os.path.dirname(__file__)), "workers")
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone"]


def torchrun(nproc: int, script: str, *args: str) -> list[str]:
    """``torchrun --standalone --nproc-per-node NPROC tests/workers/SCRIPT ARGS``."""
    return [*TORCHRUN, f"--nproc-per-node={nproc}", os.path.join(WORKERS, script), *args]


class Job:
    """One ``ranksight launch -- CMD`` in the background, its store a chdb folder under
    ``folder``. ``opts`` go to launch before ``--``; ``extra_env`` to the job."""

    def __init__(self, folder: str, cmd: list[str], *opts: str, **extra_env: str) -> None:
        self.folder, self.store_url = folder, os.path.join(folder, "store")
        environ = {**os.environ, env.HOME: os.path.join(folder, "home"), "OMP_NUM_THREADS": "1",
                   "TOKENIZERS_PARALLELISM": "false", **extra_env}  # fmt: skip
        environ.pop(env.RUN_ID, None)
        self.log_path = os.path.join(folder, "launch.log")
        args = [sys.executable, "-m", "ranksight.cli", "launch", "--store", self.store_url,
                "--spool", os.path.join(folder, "spool"), *opts, "--", *cmd]  # fmt: skip
        self.started = time.monotonic()
        self._log = open(self.log_path, "w")  # noqa: SIM115 - closed in wait()
        self.proc = subprocess.Popen(args, env=environ, stdout=self._log, stderr=subprocess.STDOUT)

    @property
    def output(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()

    @property
    def run_id(self) -> str:
        """The run id launch printed (waits for it, up to 60 s)."""
        deadline = time.monotonic() + 60
        while "ranksight launch: run " not in self.output:
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise AssertionError(f"launch printed no run id:\n{self.output[-3000:]}")
            time.sleep(0.2)
        return self.output.split("ranksight launch: run ", 1)[1].split()[0]

    def wait(self, timeout_s: float = 420) -> int:
        """Wait for launch to end; returns its exit code. Past ``timeout_s`` launch and
        every process under it (torchrun, the ranks) are killed and TimeoutExpired is
        raised: nothing of this job outlives its test."""
        try:
            return self.proc.wait(timeout_s)
        finally:
            if self.proc.poll() is None:
                kill_tree(self.proc.pid)
                self.proc.wait()
            self._log.close()

    def query(self, sql: str) -> pd.DataFrame:
        """``sql`` on the job's store, ``%(r)s`` bound to its run id."""
        with open_store(self.store_url) as s:
            return s.query(sql, {"r": self.run_id})

    def analysis(self, save: bool = False):
        """``analyze`` of the run as it is stored now."""
        from ranksight.analyzer import analyze

        with open_store(self.store_url) as s:
            return analyze(s, self.run_id, save=save)

    def detect(self, found: Callable[[list], bool], timeout_s: float, every_s: float = 3.0):
        """Poll the analysis every ``every_s`` until ``found(findings)``; returns
        ``(seconds since this call, findings)``, or ``(None, last findings)`` after
        ``timeout_s`` or once the job ended."""
        t0 = time.monotonic()
        findings: list = []
        while time.monotonic() - t0 < timeout_s:
            try:
                findings = self.analysis().findings
            except Exception:  # noqa: BLE001 - no run rows yet
                findings = []
            if found(findings):
                return time.monotonic() - t0, findings
            if self.proc.poll() is not None:
                break
            time.sleep(every_s)
        return None, findings

    def await_steps(self, rows: int, timeout_s: float, every_s: float = 0.5) -> bool:
        """Wait until ``rows`` step rows of the run are stored (True), the job ends or
        ``timeout_s`` passes (False); reads the row count only, never the analysis, so
        the wait costs the job no CPU."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.proc.poll() is None:
            if steps_stored(self) >= rows:
                return True
            time.sleep(every_s)
        return False


def described(findings: list) -> list[tuple[str, str, int]]:
    """``(kind, cause, culprit rank)`` of each finding, for assertion messages."""
    return [(f.kind, f.cause, f.culprit_rank) for f in findings]


# ---------------------------------------------------------------------------- matrix
@dataclass(frozen=True)
class Framework:
    """One trainer of the matrix, as a user starts it under ``ranksight launch --``."""

    name: str
    attach: str
    """How it is started (the table's attach column)."""
    marker: str
    """A word of every rank's command line (its worker script)."""
    command: Callable[[int, float, str], list[str]]
    """``(steps, sleep_ms between steps, scratch folder) -> the command after --``."""


def _lightning_alone(steps: int, sleep_ms: float, _: str) -> list[str]:
    return [sys.executable, os.path.join(WORKERS, "lightning_job.py"), str(steps), str(sleep_ms)]


FRAMEWORKS: dict[str, Framework] = {
    f.name: f
    for f in (
        Framework("plain DDP", "zero-code, torchrun", "ddp_job.py",
                  lambda n, ms, _: torchrun(4, "ddp_job.py", str(n), "--sleep-ms", str(ms))),
        Framework("FSDP2", "zero-code, torchrun", "fsdp2_job.py",
                  lambda n, ms, _: torchrun(4, "fsdp2_job.py", str(n), "--sleep-ms", str(ms))),
        Framework("HF Trainer", "zero-code, torchrun", "hf_job.py",
                  lambda n, ms, d: torchrun(4, "hf_job.py", str(n), os.path.join(d, "out"),
                                            str(ms))),
        Framework("Lightning", "zero-code, torchrun", "lightning_job.py",
                  lambda n, ms, _: torchrun(4, "lightning_job.py", str(n), str(ms))),
        Framework("Lightning (own launcher)", "zero-code, python train.py (devices=4)",
                  "lightning_job.py", _lightning_alone),
    )
}  # fmt: skip
"""Every trainer of the matrix, by name: 4 CPU ranks on gloo, a small random model."""


@dataclass(frozen=True)
class Fault:
    """One fault put on local rank 1 from outside the job once ``after_steps`` steps are
    stored; ``kind``/``cause`` is what the analysis must name (rank 1), "" for none."""

    name: str
    words: str
    """What was done, for the table."""
    steps: int
    """The job's length in steps."""
    sleep_ms: float
    """Each rank's sleep between steps: paces the job so that the fault lands in it on an
    idle machine too (steps reach the store a few seconds after they end)."""
    kind: str = ""
    cause: str = ""
    after_steps: int = 8


FAULTS: dict[str, Fault] = {
    f.name: f
    for f in (
        Fault("clean", "none", 40, 50.0),
        Fault("quota", "CPU quota 3% of one CPU on rank 1's cgroup until the job ends", 60,
              200.0, "straggler", "cpu_contention"),
        Fault("sigstop", "SIGSTOP of rank 1, SIGCONT once the hang is named (or after 90 s)",
              60, 200.0, "hang", "stopped"),
        Fault("sigkill", "SIGKILL of rank 1", 400, 100.0, "crash", ""),
    )
}  # fmt: skip
"""Every fault of the matrix, by name (``clean``: the same job with none)."""

QUOTA_WAIT_S = 900.0
"""How long a job whose rank 1 runs on 3% of a CPU may take to end once the straggler is
named (about 45 of its steps left, 1.5-2 s each on a quiet 2-core machine, several times
that on one loaded by other jobs)."""

STALL_CONFIG = "[agent]\nstall_s = 5\n"
"""The agent's configuration for every run: stacks taken 5 s into a stall."""


@dataclass
class Outcome:
    """What one run of the matrix gave."""

    framework: Framework
    fault: Fault
    exit_code: int = -1
    detected_s: float | None = None
    """Seconds from the fault to the first analysis naming it (None: never)."""
    live: list = field(default_factory=list)
    final: list = field(default_factory=list)
    """The findings of the analysis once the job ended (saved to the store)."""
    stored: list = field(default_factory=list)
    """``(kind, cause, culprit rank)`` of the stored findings, largest impact first."""
    report_rc: int = -1
    """``ranksight report``'s exit code (3: a culprit; 0: none)."""
    report_err: str = ""
    load: tuple[float, float, float] = (0.0, 0.0, 0.0)
    """The machine's load average (1, 5, 15 min) as the run ended."""
    output: str = ""
    landed: bool = True
    """The fault was put on a rank still training (False: the job had ended first)."""

    @property
    def named(self) -> bool:
        """The final analysis' first finding is the fault on rank 1 (none for clean)."""
        if not self.fault.kind:
            return self.final == []
        return bool(self.final) and _names(self.final[0], self.fault)

    @property
    def right(self) -> bool:
        """Named live and at the end, stored as reported, the report printed."""
        live_ok = not self.fault.kind or self.detected_s is not None
        stored_ok = self.stored == described(self.final)
        report_ok = (
            self.report_rc == (3 if self.final else 0) and "Traceback" not in self.report_err
        )
        return self.landed and self.named and live_ok and stored_ok and report_ok

    def explain(self) -> str:
        """Everything, for an assertion message."""
        return (f"{self.framework.name} / {self.fault.name}: landed {self.landed}, exit "
                f"{self.exit_code}, detected "
                f"{self.detected_s}, live {described(self.live)}, final {described(self.final)}, "
                f"stored {self.stored}, report rc {self.report_rc} {self.report_err[-800:]}\n"
                + "\n".join(f.summary for f in self.final) + "\n" + self.output[-2500:])  # fmt: skip


def _names(f, fault: Fault) -> bool:
    return f.kind == fault.kind and f.culprit_rank == 1 and (
        not fault.cause or f.cause == fault.cause)  # fmt: skip


def steps_stored(job: Job) -> int:
    """Step rows stored so far for the job's run (0 before it has any)."""
    try:
        return int(job.query("SELECT count() AS n FROM steps WHERE run_id = %(r)s")["n"][0])
    except Exception:  # noqa: BLE001 - no run yet
        return 0


def _inject(job: Job, fault: Fault, pid: int) -> tuple[float | None, list]:
    """Put ``fault`` on ``pid`` and poll until the analysis names it; the job is left
    to end by itself."""
    found = lambda fs: any(_names(f, fault) for f in fs)  # noqa: E731
    if fault.name == "quota":
        with slowed(pid):
            seconds, live = job.detect(found, 240, 2.0)
            job.wait(QUOTA_WAIT_S)
        return seconds, live
    if fault.name == "sigstop":
        os.kill(pid, signal.SIGSTOP)
        try:
            return job.detect(found, 90, 2.0)
        finally:
            os.kill(pid, signal.SIGCONT)
    os.kill(pid, signal.SIGKILL)
    return job.detect(found, 120, 1.0)


def run_case(folder: str, framework: Framework, fault: Fault) -> Outcome:
    """Run ``framework`` under launch with ``fault`` on local rank 1 once
    ``fault.after_steps`` steps are stored; analyze, save and report the run."""
    os.makedirs(folder, exist_ok=True)
    config = os.path.join(folder, "ranksight.toml")
    with open(config, "w") as f:
        f.write(STALL_CONFIG)
    job = Job(folder, framework.command(fault.steps, fault.sleep_ms, folder), "--config", config)
    out = Outcome(framework, fault)
    try:
        if fault.kind:
            victim = rank_process(framework.marker, 1, within=job.proc.pid)
            job.await_steps(4 * fault.after_steps, 240)
            out.landed = job.proc.poll() is None and victim.is_running()
            if out.landed:
                try:
                    out.detected_s, out.live = _inject(job, fault, victim.pid)
                except ProcessLookupError:  # it ended between the look and the signal
                    out.landed = False
        out.exit_code = job.wait()
    finally:
        if job.proc.poll() is None:
            job.wait(1)
    out.output = job.output
    out.final = job.analysis(save=True).findings
    out.stored = [tuple(r) for r in job.query(
        "SELECT kind, cause, culprit_rank FROM findings WHERE run_id = %(r)s "
        "ORDER BY impact_pct DESC, confidence DESC").itertuples(index=False)]  # fmt: skip
    report = subprocess.run(
        [sys.executable, "-m", "ranksight.cli", "report", "--store", job.store_url, "--run",
         job.run_id], capture_output=True, text=True, timeout=180)  # fmt: skip
    out.report_rc, out.report_err = report.returncode, report.stderr
    out.load = os.getloadavg()
    return out
