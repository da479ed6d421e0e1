"""Launch pieces shared by ``ranksight demo`` and ``ranksight faultmatrix``: a node agent
process, the reference trainer under torchrun with the hooks on, and their clean-up."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence

from ranksight.ground import env
from ranksight.store.url import split_password

STORE_SECRETS = (env.CH_PASSWORD, env.CH_PASSWORD_FILE)
"""Variables that give the store's password: the agent gets them, the training job never."""


def job_env(run_id: str, spool: str, store_url: str) -> dict[str, str]:
    """The environment of the ranks (and, with :func:`agent_env`, of the agent): run id,
    spool, hooks on, the store URL without its password, one OpenMP thread per rank (8
    ranks share a few cores)."""
    return {
        **public_env(os.environ, store_url),
        env.RUN_ID: run_id,
        env.SPOOL_DIR: spool,
        env.LEVEL: "default",
        "OMP_NUM_THREADS": "1",
    }


def public_env(environ: Mapping[str, str], store_url: str) -> dict[str, str]:
    """``environ`` for a process that never talks to the store (the training job: its
    hooks write the spool only): ``$RANKSIGHT_STORE`` is ``store_url`` without its
    password, and no :data:`STORE_SECRETS`. Raises StoreError as :func:`split_password`."""
    out = {k: v for k, v in environ.items() if k not in STORE_SECRETS}
    out[env.STORE] = split_password(store_url)[0]
    return out


def agent_env(child_env: Mapping[str, str], store_url: str) -> dict[str, str]:
    """``child_env`` plus the store's password for an agent: the one in ``store_url``
    (as ``$RANKSIGHT_CH_PASSWORD``), else this process's own :data:`STORE_SECRETS`. The
    environment, not the command line: ``/proc/PID/environ`` is readable by the agent's
    user and root only, ``/proc/PID/cmdline`` by everyone."""
    password = split_password(store_url)[1]
    if password is not None:
        return {**child_env, env.CH_PASSWORD: password}
    return {**child_env, **{k: os.environ[k] for k in STORE_SECRETS if k in os.environ}}


def start_agent(
    spool: str,
    store_url: str,
    child_env: dict[str, str],
    log_path: str,
    extra: Sequence[str] = (),
) -> subprocess.Popen:
    """A ``ranksight agent`` process shipping ``spool`` to ``store_url`` every 0.5 s (and
    the ``extra`` agent options); its log is appended to ``log_path``. Its command line
    names the store without the password, which it gets by :func:`agent_env`. It runs
    at nice :data:`AGENT_NICE`: on a busy host the ranks get the CPU first."""
    public = split_password(store_url)[0]
    cmd = [sys.executable, "-m", "ranksight.cli", "agent", "--spool", spool,
           "--store", public, "--interval", "0.5", *extra]  # fmt: skip
    with open(log_path, "a") as log:
        return subprocess.Popen(
            cmd,
            env=agent_env(child_env, store_url),
            stdout=subprocess.DEVNULL,
            stderr=log,
            preexec_fn=_lower_priority,
        )


AGENT_NICE = 10
"""Niceness of the agents the launch pieces start (and of the live analysis threads)."""


def _lower_priority() -> None:
    try:
        os.nice(AGENT_NICE)
    except OSError:
        pass


def lower_thread_priority() -> None:
    """Lower the calling thread's CPU priority to :data:`AGENT_NICE` (on Linux
    ``setpriority(PRIO_PROCESS, 0)`` applies to the calling thread only): for a harness
    that analyzes a job while it runs beside it on the same cores."""
    try:
        os.setpriority(os.PRIO_PROCESS, 0, AGENT_NICE)
    except (OSError, AttributeError):
        pass


def trainer_cmd(
    *,
    dp: int,
    tp: int,
    pp: int,
    steps: int,
    run_id: str,
    inject: Sequence[str],
    extra: Sequence[str] = (),
) -> list[str]:
    """torchrun (standalone, one process per rank) of the reference trainer with the hooks
    on, each fault spec of ``inject`` (``["none"]`` for a clean run) and the trainer
    flags ``extra`` (``["--layers", "4", "--layer-split", "3,1"]``)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={dp * tp * pp}", "-m", "ranksight.reference_trainer.train",
           "--dp", str(dp), "--tp", str(tp), "--pp", str(pp), "--steps", str(steps),
           "--run-id", run_id, "--hooks", "default"]  # fmt: skip
    for spec in inject or ["none"]:
        cmd += ["--inject", spec]
    return cmd + list(extra)


def stop(proc: subprocess.Popen, sig: int = signal.SIGTERM, wait_s: float = 30.0) -> int:
    """Send ``sig`` if ``proc`` still runs, wait up to ``wait_s``, then kill; returns the
    exit code."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


def first_failure(log_path: str) -> str:
    """``": rank R failed first (exit code C)"`` from torchrun's error summary in the log,
    or ``""``."""
    try:
        with open(log_path, errors="replace") as f:
            text = f.read()
    except OSError:
        return ""
    root = text.rfind("Root Cause")
    m = (
        re.search(r"rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)", text[root:], re.S)
        if root >= 0
        else None
    )
    return f": rank {m.group(1)} failed first (exit code {m.group(2)})" if m else ""
