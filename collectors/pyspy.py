"""Python stacks of the local rank processes, dumped with py-spy (``py-spy dump --json``).

py-spy reads another process's memory through ptrace (``process_vm_readv``), so the agent
must run as the ranks' user or as root with the ``SYS_PTRACE`` capability; without that,
py-spy answers "Permission Denied" and :class:`StackTaker` says so once, with the fix.
Dumps of all ranks of a node run in parallel, so they show the same moment as closely as
a node allows. Only processes the spool proves to be a run's ranks are ever dumped
(:func:`~ranksight.collectors.local_ranks.rank_problem`: the rank's own spool file names
the pid, the process runs as the file's owner and holds it open); any other pid handed to
:class:`StackTaker`, e.g. from a forged ``ranks`` row, is refused, named and logged.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import sysconfig
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from ranksight.store.fit import fit

from .base import Unavailable
from .local_ranks import LocalRank, rank_problem

log = logging.getLogger("ranksight.collectors.pyspy")

PERMISSION_FIX = (
    "py-spy may not read the rank processes (ptrace permission denied): run the agent as the "
    "same user as the ranks, or as root with the SYS_PTRACE capability (docker run --cap-add "
    "SYS_PTRACE; Kubernetes securityContext.capabilities.add: [SYS_PTRACE]); with "
    "kernel.yama.ptrace_scope=1 a non-root agent also needs SYS_PTRACE"
)
_DENIED = ("permission denied", "operation not permitted", "eperm")


@dataclass(kw_only=True, slots=True)
class PySpyConfig:
    """How stacks are taken."""

    command: tuple[str, ...] = ()
    """The py-spy command (may start with a wrapper); empty: ``py-spy`` from PATH or
    beside this Python."""
    native: bool = False
    """Also walk native (C/C++/CUDA runtime) frames (``--native``; slower)."""
    timeout_s: float = 30.0
    """Give up on one process's dump after this many seconds."""
    parallel: int = 16
    """Most dumps running at once."""

    def __post_init__(self) -> None:
        if self.timeout_s <= 0:
            raise ValueError(f"py-spy timeout_s must be > 0, got {self.timeout_s}")
        if self.parallel < 1:
            raise ValueError(f"py-spy parallel must be >= 1, got {self.parallel}")


@dataclass(frozen=True, slots=True)
class StackDump:
    """One process's dump."""

    pid: int
    ok: bool
    error: str
    """py-spy's message (first line) when not ok."""
    threads: tuple[dict, ...]
    """py-spy's JSON threads: thread_name, os_thread_id, active, owns_gil, frames
    (innermost first: name, filename, short_filename, line)."""
    raw_json: str
    took_ms: float
    native: bool
    permission_denied: bool


def find_pyspy() -> str | None:
    """Path of the ``py-spy`` executable: PATH first, then this Python's scripts folder."""
    found = shutil.which("py-spy")
    if found:
        return found
    beside = os.path.join(sysconfig.get_path("scripts"), "py-spy")
    if os.access(beside, os.X_OK):
        return beside
    beside = os.path.join(os.path.dirname(sys.executable), "py-spy")
    return beside if os.access(beside, os.X_OK) else None


def dump(pid: int, command: tuple[str, ...], config: PySpyConfig) -> StackDump:
    """Dump ``pid`` with ``command`` (the py-spy command line start); retries once on a
    failure other than a permission error (a process still starting is not readable)."""
    result = _dump_once(pid, command, config)
    if not result.ok and not result.permission_denied:
        time.sleep(0.3)
        result = _dump_once(pid, command, config)
    return result


def _dump_once(pid: int, command: tuple[str, ...], config: PySpyConfig) -> StackDump:
    args = [*command, "dump", "--pid", str(pid), "--json"] + (["--native"] if config.native else [])
    t0 = time.monotonic()
    try:
        out = subprocess.run(args, capture_output=True, timeout=config.timeout_s)
        text, err, rc = out.stdout, out.stderr, out.returncode
    except subprocess.TimeoutExpired:
        text, err, rc = b"", f"py-spy timed out after {config.timeout_s:g} s".encode(), -1
    return parse_dump(pid, rc, text, err, (time.monotonic() - t0) * 1000, config.native)


def parse_dump(
    pid: int, rc: int, stdout: bytes, stderr: bytes, took_ms: float, native: bool
) -> StackDump:
    """The :class:`StackDump` of what ``py-spy dump --json`` printed (bytes; what is no
    UTF-8 is replaced) and its exit status ``rc``: ok only for exit 0 with a JSON list of
    thread objects; anything else is a failed dump whose error says what it printed."""
    text, err = stdout.decode("utf-8", "replace"), stderr.decode("utf-8", "replace")
    if rc == 0:
        try:
            threads = json.loads(text)
        except (ValueError, RecursionError) as exc:
            err = f"py-spy printed no JSON: {str(exc)[:200] or type(exc).__name__}"
        else:
            if isinstance(threads, list) and all(isinstance(t, dict) for t in threads):
                return StackDump(pid, True, "", tuple(threads), text, took_ms, native, False)
            err = "py-spy printed JSON that is no list of threads"
    message = _first_line(err or text) or f"py-spy exited with {rc}"
    denied = any(d in (err + text).lower() for d in _DENIED)
    return StackDump(pid, False, message, (), "", took_ms, native, denied)


def _first_line(text: str) -> str:
    for line in text.splitlines():
        if line.strip():
            return line.strip()[:500]
    return ""


def summarize(threads: tuple[dict, ...] | list[dict], depth: int = 4) -> str:
    """One line per thread: ``name (tid) active+gil: f (file:line) <- g (file:line) ...``
    with the ``depth`` innermost frames (a frame or frame list of another shape is
    shown as ``?``)."""
    lines = []
    for t in threads:
        state = ("active" if t.get("active") else "idle") + ("+gil" if t.get("owns_gil") else "")
        frames = t.get("frames")
        shown = [_frame(f) for f in (frames if isinstance(frames, list) else ["?"])[:depth]]
        name = t.get("thread_name") or "?"
        lines.append(
            f"{name} ({t.get('os_thread_id')}) {state}: {' <- '.join(shown) or '(no frames)'}"
        )
    return "\n".join(lines)


def _frame(f) -> str:
    if not isinstance(f, dict):
        return "?"
    return f"{f.get('name')} ({f.get('short_filename') or f.get('filename')}:{f.get('line')})"


REFUSED = "refused: "
"""How the error of a rank not dumped (not proven to be that rank) starts."""


class StackTaker:
    """Dumps local rank processes and turns the dumps into ``stacks`` rows; warns once,
    with the fix, when py-spy lacks permission. Ranks that
    :func:`~ranksight.collectors.local_ranks.rank_problem` refuses are never dumped:
    :attr:`refused` holds their rows (``ok`` 0, error ``refused: <why>``) from the last
    :meth:`take`, for the caller to show, never to store. Raises :class:`Unavailable` if
    py-spy is not installed."""

    def __init__(self, host: str, config: PySpyConfig | None = None) -> None:
        self.host = host
        self.config = config or PySpyConfig()
        if self.config.command:
            self.command = self.config.command
        else:
            path = find_pyspy()
            if path is None:
                raise Unavailable("py-spy is not installed (pip install py-spy)")
            self.command = (path,)
        self.permission_warned = False
        self.refused: list[dict] = []

    def take(self, ranks: list[LocalRank], trigger: str) -> list[dict]:
        """Dump every rank in ``ranks`` that the spool proves (the others go to
        :attr:`refused`, each logged as a warning) in parallel; one ``stacks`` row each
        (failed dumps too, with their error), tagged with ``trigger`` and the time the
        dumps began."""
        ts = time.time_ns()
        self.refused, proven = [], []
        for lr in ranks:
            problem = rank_problem(lr)
            if problem is None:
                proven.append(lr)
                continue
            log.warning("not dumping rank %d of run %s: %s", lr.rank, lr.run_id, problem)
            no_dump = StackDump(
                lr.pid, False, REFUSED + problem, (), "", 0.0, self.config.native, False
            )
            self.refused.append(self.row(lr, no_dump, trigger, ts))
        ranks = proven
        if not ranks:
            return []
        workers = min(self.config.parallel, len(ranks))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="ranksight-pyspy") as pool:
            dumps = list(pool.map(lambda r: dump(r.pid, self.command, self.config), ranks))
        if any(d.permission_denied for d in dumps) and not self.permission_warned:
            self.permission_warned = True
            log.warning(PERMISSION_FIX)
        return [self.row(lr, d, trigger, ts) for lr, d in zip(ranks, dumps, strict=True)]

    def row(self, lr: LocalRank, d: StackDump, trigger: str, ts: int) -> dict:
        """The ``stacks`` row of dump ``d`` of rank ``lr`` (text made to fit its column:
        JSON may name a thread with a lone surrogate, ``"\\udcff"``)."""
        error = f"{d.error} -- {PERMISSION_FIX}" if d.permission_denied else d.error
        (row,) = fit("stacks", [self._row(lr, d, trigger, ts, error)])
        return row

    def _row(self, lr: LocalRank, d: StackDump, trigger: str, ts: int, error: str) -> dict:
        return {
            "run_id": lr.run_id,
            "attempt": lr.attempt,
            "rank": lr.rank,
            "host": self.host,
            "pid": lr.pid,
            "ts_ns": ts,
            "trigger": trigger,
            "native": int(d.native),
            "ok": int(d.ok),
            "error": error,
            "threads": len(d.threads),
            "summary": summarize(d.threads),
            "stack_json": d.raw_json,
            "took_ms": d.took_ms,
        }


def main_thread(summary: str) -> str:
    """The main thread's line of a stack summary (else its first line), without the
    thread id, so equal stacks of different processes compare equal."""
    lines = summary.splitlines()
    line = next((ln for ln in lines if ln.startswith("MainThread")), lines[0] if lines else "")
    name, _, rest = line.partition(" (")
    return f"{name}: {rest.partition(': ')[2]}" if rest else line
