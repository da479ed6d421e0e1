"""``ranksight launch [options] -- COMMAND``: run a training job with ranksight on.

On each node (a multi-node torchrun runs the wrapper on every node, as torchrun itself):

1. the run id: ``--run-id``, else ``$RANKSIGHT_RUN_ID``, else torchrun's ``--rdzv-id``
   (the same on every node by torchrun's own rules), else a new one (single node only: a
   command with ``--nnodes`` above 1 and no id is refused, as each node would invent its
   own);
2. the node agent: reused if one already ships this spool to this store (its lock in
   ``<spool>/.agent-<hash>/lock`` is held: a systemd or DaemonSet agent), else started
   for the job's life and stopped (drained) after it;
3. the job's environment: run id, spool, store, hook level, zero-code attach
   (``trainer_hooks/autoattach.py``: a ``sitecustomize`` on ``PYTHONPATH``), Flight
   Recorder buffer and dump prefix (torch's own variables, if not set already);
4. the run's status: ``running`` at start, then ``finished`` (exit 0), ``failed``
   (non-zero exit) or ``killed`` (the wrapper got SIGTERM/SIGINT/SIGHUP: it forwards
   SIGTERM to the job, waits ``grace_s``, then SIGKILLs it), written straight to the store
   with ``updated_ns`` after the job's own rows, so it is the status readers see. A node
   that finishes cleanly while another node already recorded a failure leaves that
   failure standing.

The wrapper exits with the job's exit code (128 + signal number when it was killed).
"""

from __future__ import annotations

import glob
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from ranksight.ground import env
from ranksight.launcher import processes as launch
from ranksight.trainer_hooks.config import LEVELS, new_run_id

STATUSES = ("running", "finished", "failed", "killed")
"""What the wrapper records as the run's status."""
FR_BUFFER = "TORCH_FR_BUFFER_SIZE"
"""torch's Flight Recorder ring size (entries); ``TORCH_NCCL_TRACE_BUFFER_SIZE`` before 2.7."""
FR_BUFFER_OLD = "TORCH_NCCL_TRACE_BUFFER_SIZE"
_RUN_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")


@dataclass(kw_only=True, slots=True)
class LaunchConfig:
    """One ``ranksight launch``."""

    command: tuple[str, ...]
    """The launcher command line (``torchrun ...``, ``python -m torch.distributed.run ...``)."""
    run_id: str | None = None
    """Run id; None: ``$RANKSIGHT_RUN_ID``, torchrun's ``--rdzv-id``, or a new one."""
    store: str | None = None
    """Store URL; None: ``$RANKSIGHT_STORE`` or ``$RANKSIGHT_HOME/store``."""
    spool: str | None = None
    """Node-local spool folder; None: ``$RANKSIGHT_SPOOL_DIR`` or ``$RANKSIGHT_HOME/spool``."""
    level: str = "default"
    """Hook level, one of ``trainer_hooks.LEVELS``."""
    auto_attach: bool = True
    """Attach the hooks to workers that do not call them (``trainer_hooks/autoattach.py``)."""
    mesh: str | None = None
    """Mesh shape for auto-attached hooks (``dp=2,pp=2,tp=2``)."""
    agent: str = "auto"
    """``auto``: reuse this node's agent or start one; ``never``: start none (records wait
    in the spool for an agent)."""
    agent_args: tuple[str, ...] = ()
    """Extra ``ranksight agent`` options for an agent the wrapper starts."""
    flight_recorder: bool = True
    """Turn torch's Flight Recorder on (2000 entries, :data:`FR_BUFFER`) and set its dump
    prefix, where the caller's environment has not."""
    grace_s: float = 30.0
    """After forwarding SIGTERM to the job, seconds before SIGKILL."""
    home: str = field(default_factory=lambda: os.environ.get(env.HOME) or env.DEFAULT_HOME)
    """Folder for the agent's log."""

    def __post_init__(self) -> None:
        if not self.command:
            raise ValueError(
                "no command to launch: put it after '--' (ranksight launch -- torchrun ...)"
            )
        if self.level not in LEVELS:
            raise ValueError(f"--level {self.level!r} is not one of {', '.join(LEVELS)}")
        if self.agent not in ("auto", "never"):
            raise ValueError(f"--agent {self.agent!r} is not one of auto, never")
        if self.run_id is not None and not _RUN_ID.match(self.run_id):
            raise ValueError(
                f"--run-id {self.run_id!r}: use 1-128 letters, digits and . _ : - (no '/')"
            )
        if self.mesh:
            from ranksight.trainer_hooks.autoattach import parse_mesh

            parse_mesh(self.mesh, "--mesh")
        if self.grace_s < 0:
            raise ValueError(f"--grace-s must be >= 0, got {self.grace_s}")


def torchrun_option(command: Sequence[str], *names: str) -> str | None:
    """The value of the first of ``names`` (``--rdzv-id``, ``--rdzv_id``...) in
    ``command``, as ``--name value`` or ``--name=value``; None if absent."""
    for i, word in enumerate(command):
        for name in names:
            if word == name and i + 1 < len(command):
                return command[i + 1]
            if word.startswith(name + "="):
                return word.split("=", 1)[1]
    return None


def resolve_run_id(cfg: LaunchConfig) -> str:
    """The run id per the module doc. Raises ValueError for a multi-node command with no
    id, or an id that cannot name a spool folder."""
    rid = cfg.run_id or os.environ.get(env.RUN_ID)
    if not rid:
        rdzv = torchrun_option(cfg.command, "--rdzv-id", "--rdzv_id")
        if rdzv and rdzv != "none":
            rid = f"run-{rdzv}"
    if not rid:
        nnodes = torchrun_option(cfg.command, "--nnodes") or "1"
        if nnodes.split(":")[-1] not in ("1", ""):
            raise ValueError(
                f"--nnodes {nnodes}: every node must record under one run id; pass --run-id "
                "(the same on each node) or torchrun's --rdzv-id"
            )
        rid = new_run_id()
    if not _RUN_ID.match(rid):
        raise ValueError(f"run id {rid!r}: use 1-128 letters, digits and . _ : - (no '/')")
    return rid


def node_rank(command: Sequence[str]) -> int:
    """This node's rank: torchrun's ``--node-rank``, else ``$NODE_RANK`` / ``$GROUP_RANK``,
    else 0."""
    value = (
        torchrun_option(command, "--node-rank", "--node_rank")
        or os.environ.get("NODE_RANK")
        or os.environ.get("GROUP_RANK")
        or "0"
    )
    return int(value) if value.isdigit() else 0


def agent_running(spool: str, store_url: str) -> bool:
    """Whether a node agent already ships ``spool`` to ``store_url`` (it holds the lock of
    its state folder, ``agent/agent.py``): one given the URL with its password (from
    ``$RANKSIGHT_STORE``), or without it (as :func:`ranksight.launcher.processes.start_agent` starts
    one)."""
    from ranksight.store import open_store
    from ranksight.store.url import split_password

    urls = {store_url, split_password(store_url)[0]}
    return any(_holds_lock(spool, open_store(u, connect=False).url) for u in urls)


def _holds_lock(spool: str, key: str) -> bool:
    """Whether an agent holds the lock of its state folder for ``spool`` and ``key``."""
    import fcntl

    from ranksight.agent.tailer import state_dir_for

    path = os.path.join(state_dir_for(spool, key), "lock")
    if not os.path.exists(path):
        return False
    with open(path, "a+") as handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
    return False


def job_environment(cfg: LaunchConfig, run_id: str, spool: str, store_url: str) -> dict[str, str]:
    """The job's environment: ours on top of the caller's (see the module doc), with no
    store password in it (:func:`ranksight.launcher.processes.public_env`: the hooks never talk to
    the store)."""
    from ranksight.trainer_hooks.autoattach import AUTOLOAD_DIR

    out = {**launch.public_env(os.environ, store_url), env.RUN_ID: run_id, env.SPOOL_DIR: spool,
           env.LEVEL: cfg.level}  # fmt: skip
    if cfg.auto_attach:
        out[env.AUTO_ATTACH] = "1"
        path = os.environ.get("PYTHONPATH", "")
        out["PYTHONPATH"] = AUTOLOAD_DIR + (os.pathsep + path if path else "")
    if cfg.mesh:
        out[env.MESH] = cfg.mesh
    if cfg.flight_recorder and not (out.get(FR_BUFFER) or out.get(FR_BUFFER_OLD)):
        out[FR_BUFFER if _torch_at_least(2, 7) else FR_BUFFER_OLD] = "2000"
    if cfg.flight_recorder:
        if not out.get(env.TORCH_FR_DUMP_TEMP_FILE):
            out[env.TORCH_FR_DUMP_TEMP_FILE] = os.path.join(spool, run_id, "fr-rank")
    return out


def _torch_at_least(major: int, minor: int) -> bool:
    """Whether the installed torch is at least ``major.minor`` (from its metadata: no
    import of torch here)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        found = re.match(r"(\d+)\.(\d+)", version("torch"))
    except PackageNotFoundError:
        return True
    return found is not None and (int(found.group(1)), int(found.group(2))) >= (major, minor)


def latest_attempt(spool: str, run_id: str) -> int:
    """The highest attempt with a spool folder (``<spool>/<run_id>/a<N>``) on this node, 0
    if none."""
    found = [int(m.group(1)) for p in glob.glob(os.path.join(spool, run_id, "a*"))
             if (m := re.search(r"a(\d+)$", p))]  # fmt: skip
    return max(found, default=0)


def status_row(run_id: str, attempt: int, status: str, meta: dict) -> dict:
    """A ``runs`` row recording ``status`` now (mesh sizes 0: readers take the maximum)."""
    now = time.time_ns()
    return {"run_id": run_id, "attempt": attempt, "created_ns": now, "updated_ns": now,
            "status": status, "world_size": 0, "dp": 0, "tp": 0, "pp": 0,
            "meta_json": json.dumps({"launcher": meta}, default=str)}  # fmt: skip


def record_status(store_url: str, row: dict, since_ns: int = 0, tries: int = 3) -> str | None:
    """Insert ``row`` into the store's ``runs`` (``tries`` times, 1 s apart); None when
    done, else the error. A ``finished`` row is not written when a failure of the same run
    attempt was recorded after ``since_ns`` (another node's)."""
    import pandas as pd

    from ranksight.store import StoreError, open_store

    error = None
    for i in range(tries):
        try:
            with open_store(store_url) as store:
                store.init_schema()
                if row["status"] == "finished" and _failed_since(store, row, since_ns):
                    return None
                store.insert("runs", pd.DataFrame([row]))
                return None
        except (StoreError, ValueError, OSError) as exc:
            error = str(exc)
            if i + 1 < tries:
                time.sleep(1.0)
    return error


def _failed_since(store, row: dict, since_ns: int) -> bool:
    got = store.query(
        "SELECT count() AS n FROM runs WHERE run_id = %(r)s AND attempt = %(a)s "
        "AND status IN ('failed', 'killed') AND updated_ns >= %(t)s",
        {"r": row["run_id"], "a": row["attempt"], "t": since_ns},
    )
    return int(got["n"].iloc[0]) > 0


class _Signals:
    """Forward SIGTERM/SIGINT/SIGHUP to the job once; remember the first one."""

    def __init__(self) -> None:
        self.received: int | None = None
        self.proc: subprocess.Popen | None = None
        self._old = {
            s: signal.signal(s, self._on) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
        }

    def _on(self, signum: int, _frame: object) -> None:
        if self.received is None:
            self.received = signum
            if self.proc is not None and self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)

    def restore(self) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


def run_launch(cfg: LaunchConfig, say=print) -> int:
    """Run ``cfg`` (see the module doc); returns the exit code for the wrapper. Raises
    ValueError for a bad run id; the job's own failures are exit codes, never raised."""
    from ranksight.store.url import default_store_url
    from ranksight.trainer_hooks.config import default_spool_dir

    say = _masked(say)
    run_id = resolve_run_id(cfg)
    store_url = cfg.store or default_store_url()
    spool = os.path.abspath(cfg.spool or default_spool_dir())
    os.makedirs(spool, exist_ok=True)
    node = node_rank(cfg.command)
    child_env = job_environment(cfg, run_id, spool, store_url)
    started_ns = time.time_ns()
    meta = {"command": list(cfg.command), "node_rank": node, "host": socket.gethostname(),
            "pid": os.getpid(), "level": cfg.level, "auto_attach": cfg.auto_attach}  # fmt: skip
    signals = _Signals()
    agent = None
    log_path = ""
    try:
        if cfg.agent == "auto" and not agent_running(spool, store_url):
            os.makedirs(cfg.home, exist_ok=True)
            agent = launch.start_agent(
                spool, store_url, child_env, os.path.join(cfg.home, "agent.log"), cfg.agent_args
            )
        via = "a new agent" if agent else "the node's agent" if cfg.agent == "auto" else "no agent"
        say(
            f"ranksight launch: run {run_id} node {node}: spool {spool} -> {via} -> store {store_url}"
        )
        error = record_status(store_url, status_row(run_id, 0, "running", meta), tries=1)
        if error:
            say(f"ranksight launch: warning: run status not recorded yet: {error}")
        os.makedirs(cfg.home, exist_ok=True)
        log_path = os.path.join(cfg.home, f"launch-{run_id}-node{node}.stderr")
        proc = subprocess.Popen(list(cfg.command), env=child_env, stderr=subprocess.PIPE)
        tee = _tee(proc.stderr, log_path)
        signals.proc = proc
        if signals.received is not None:  # a signal before the job existed
            proc.send_signal(signal.SIGTERM)
        code = _wait(proc, signals, cfg.grace_s)
        tee.join(10)
    except FileNotFoundError as exc:
        say(f"ranksight launch: error: cannot run {cfg.command[0]!r}: {exc.strerror}")
        code = 127
    finally:
        signals.restore()
    status = "killed" if signals.received else "finished" if code == 0 else "failed"
    meta.update(exit_code=code, signal=signals.received, ended_ns=time.time_ns())
    row = status_row(run_id, latest_attempt(spool, run_id), status, meta)
    error = record_status(store_url, row, since_ns=started_ns)
    if code != 0 and log_path:
        _record_failures(store_url, run_id, row["attempt"], log_path, say)
    if agent is not None:
        launch.stop(agent)
    say(f"ranksight launch: run {run_id} {status} (exit code {code})"
        + (f"; status NOT recorded: {error}" if error else ""))  # fmt: skip
    return 128 + signals.received if signals.received else code


def _masked(say):
    """``say`` with every store URL's password masked (``store/url.py:redact``)."""
    from ranksight.store.url import redact

    return lambda line: say(redact(line))


def _tee(stream, path: str) -> threading.Thread:
    """Copy the job's stderr to ours as it comes and to ``path`` (torchrun's failure
    summary is read from it afterwards); a thread, so the job never waits on us."""

    def copy() -> None:
        out = getattr(sys.stderr, "buffer", None)
        with open(path, "wb") as log:
            for line in iter(stream.readline, b""):
                log.write(line)
                try:
                    if out is not None:
                        out.write(line)
                        out.flush()
                except (OSError, ValueError):
                    out = None  # our stderr is gone: keep the log
        stream.close()

    t = threading.Thread(target=copy, name="ranksight-launch-tee", daemon=True)
    t.start()
    return t


def _record_failures(store_url: str, run_id: str, attempt: int, log_path: str, say) -> None:
    """torchrun's failure summary (exit codes, the root cause) as ``rank_ends`` rows."""
    from ranksight.importer.torchrun_log import record_failures
    from ranksight.store import StoreError, open_store

    try:
        with open_store(store_url) as store:
            failures = record_failures(store, run_id, log_path, attempt)
    except (StoreError, ValueError, OSError) as e:
        say(f"ranksight launch: warning: ranks' exit codes not recorded: {e}")
        return
    root = [f for f in failures if f["root_cause"]]
    if root:
        f = root[0]
        say(f"ranksight launch: rank {f['rank']} failed first (exit code {f['exitcode']})")


def _wait(proc: subprocess.Popen, signals: _Signals, grace_s: float) -> int:
    """Wait for the job; after a forwarded signal, SIGKILL it past ``grace_s``."""
    while True:
        try:
            return proc.wait(timeout=0.5)
        except subprocess.TimeoutExpired:
            pass
        if signals.received is not None:
            try:
                return proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                return proc.wait()
