"""Running a real framework's training job under ``ranksight launch`` for the framework
tests (``tests/test_frameworks*.py``): start it, find its ranks, inject a fault from
outside (``tests/outside_faults.py``), poll the analysis until it names what was
injected (time to detection), and read what was stored."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable

import pandas as pd

from ranksight import env
from ranksight.store import open_store

WORKERS = os.path.join(os.path.dirname(__file__), "workers")
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
        """Wait for launch to end; returns its exit code."""
        try:
            return self.proc.wait(timeout_s)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
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


def described(findings: list) -> list[tuple[str, str, int]]:
    """``(kind, cause, culprit rank)`` of each finding, for assertion messages."""
    return [(f.kind, f.cause, f.culprit_rank) for f in findings]
