"""Which processes on this node are ranks: from the spool files they write, or the store.

Each hooked rank writes ``<spool>/<run_id>/a<attempt>/rank<rank:05d>-<pid>-<n>.spool``
segments (``trainer_hooks/spool.py``; older hooks: ``rank<rank:05d>-<pid>.jsonl``), so the
agent knows the local ranks and their pids without
asking anyone. A process counts as that rank while its pid is alive and was started no
later than the file was last written (a reused pid belongs to a younger process).
Before a process is inspected from outside (py-spy), :func:`rank_problem` checks that it
is that rank's process: it runs as the spool file's owner and holds the file open.
"""

from __future__ import annotations

import contextlib
import glob
import os
import re
import threading
import time
from dataclasses import dataclass

import psutil

_NAME = re.compile(r"rank([0-9]{1,10})-([0-9]{1,10})(?:-([0-9]{1,20})\.spool|\.jsonl)", re.ASCII)
_ATTEMPT = re.compile(r"a([0-9]{1,10})", re.ASCII)


@dataclass(frozen=True, slots=True)
class LocalRank:
    """One rank process on this node."""

    run_id: str
    attempt: int
    rank: int
    pid: int
    spool_path: str
    """Its spool file, the newest segment ("" when found through the store)."""


def run_place(path: str, name: re.Pattern) -> tuple[str, int, re.Match] | None:
    """``(run_id, attempt, match of name)`` of a file the hooks write under
    ``<spool>/<run_id>/a<attempt>/``, or None if the path is no such file: the file name
    does not match ``name`` in full, the attempt is not ``a`` and ASCII digits below
    ``2**32``, or the run folder's name is empty or no UTF-8."""
    m = name.fullmatch(os.path.basename(path))
    a = _ATTEMPT.fullmatch(os.path.basename(os.path.dirname(path)))
    run_id = os.path.basename(os.path.dirname(os.path.dirname(path)))
    if not m or not a or not run_id or int(a.group(1)) >= 1 << 32:
        return None
    try:
        run_id.encode("utf-8")
    except UnicodeEncodeError:  # a name of bytes that are no UTF-8: not the hooks'
        return None
    return run_id, int(a.group(1)), m


def parse_spool_path(path: str) -> LocalRank | None:
    """The rank a spool file path names, or None if the path is not a spool file (see
    :func:`run_place`; the rank must be below ``2**31`` and the pid 1 to ``2**32 - 1``,
    ASCII digits, as the hooks write them)."""
    place = run_place(path, _NAME)
    if place is None:
        return None
    run_id, attempt, m = place
    rank, pid = int(m.group(1)), int(m.group(2))
    if rank >= 1 << 31 or not 0 < pid < 1 << 32:
        return None
    return LocalRank(run_id, attempt, rank, pid, path)


def is_alive(pid: int, written_s: float | None = None) -> bool:
    """True if ``pid`` runs and (given ``written_s``, a file's mtime in s) started no later
    than that file was written (1 s slack for clock granularity)."""
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        return written_s is None or proc.create_time() <= written_s + 1.0
    except psutil.Error:
        return False


def scan_spool(
    spool_dir: str, *, alive_only: bool = True, max_age_s: float | None = None
) -> list[LocalRank]:
    """Ranks with a spool file under ``spool_dir``, sorted by (run_id, attempt, rank).

    ``alive_only``: only ranks whose process runs now. ``max_age_s``: only files written in
    the last that many seconds. A missing folder gives an empty list.
    """
    found, now = {}, time.time()
    for path in sorted(glob.glob(os.path.join(glob.escape(spool_dir), "*", "a*", "rank*"))):
        lr = parse_spool_path(path)
        if lr is None:
            continue
        try:
            mtime = os.stat(path).st_mtime
        except OSError:
            continue
        if max_age_s is not None and now - mtime > max_age_s:
            continue
        if alive_only and not is_alive(lr.pid, mtime):
            continue
        found[(lr.run_id, lr.attempt, lr.rank, lr.pid)] = lr  # sorted: the newest segment wins
    return [found[k] for k in sorted(found)]


def from_store(store, run_id: str, host: str, attempt: int | None = None) -> list[LocalRank]:
    """Live pids of ``run_id`` that the ``ranks`` table places on ``host`` (latest
    attempt unless given), with no spool file: candidates only, which prove nothing
    (anyone who can write the store can write a row; :func:`rank_problem` refuses them).
    Raises StoreError if the store cannot be read."""
    sql = "SELECT attempt, rank, pid FROM ranks WHERE run_id = %(r)s AND host = %(h)s"
    params: dict = {"r": run_id, "h": host}
    if attempt is not None:
        sql += " AND attempt = %(a)s"
        params["a"] = attempt
    rows = store.query(sql, params).to_dict("records")
    if rows and attempt is None:
        latest = max(int(r["attempt"]) for r in rows)
        rows = [r for r in rows if int(r["attempt"]) == latest]
    ranks = {(int(r["attempt"]), int(r["rank"]), int(r["pid"])) for r in rows}
    return [LocalRank(run_id, a, k, p, "") for a, k, p in sorted(ranks) if is_alive(p)]


def rank_problem(lr: LocalRank) -> str | None:
    """Why ``lr.pid`` may not be taken for rank ``lr.rank`` of run ``lr.run_id`` (a
    sentence naming the pid), or None when the spool proves it is: ``lr.spool_path`` is a
    spool file naming that run, attempt, rank and pid, the process runs as the file's
    owner (real and effective uid), and it holds one of that rank's spool files open
    (``/proc/PID/fd``, readable with the same ptrace permission py-spy needs). A row of
    the ``ranks`` table alone, a file planted beside the ranks' files, or a pid reused by
    another process proves nothing."""
    pid, rank = lr.pid, lr.rank
    if not lr.spool_path:
        return f"pid {pid} is named by the ranks table only, not by a spool file on this node"
    named = parse_spool_path(lr.spool_path)
    if named is None or (named.run_id, named.attempt, named.rank, named.pid) != (
        lr.run_id, lr.attempt, rank, pid
    ):  # fmt: skip
        return f"pid {pid}: {lr.spool_path} does not name rank {rank} of run {lr.run_id}"
    try:
        owner = os.stat(lr.spool_path).st_uid
        uids = psutil.Process(pid).uids()
    except (OSError, psutil.Error) as exc:
        return f"pid {pid} or its spool file is gone ({exc})"
    if uids.real != owner or uids.effective != owner:
        return f"pid {pid} runs as uid {uids.real}; rank {rank}'s spool file belongs to uid {owner}"
    return _holds_spool_file(lr)


def _holds_spool_file(lr: LocalRank) -> str | None:
    """None if ``lr.pid`` has one of rank ``lr.rank``'s spool files (of that pid) open,
    else why not."""
    folder = os.path.dirname(lr.spool_path)
    prefix = f"rank{lr.rank:05d}-{lr.pid}"
    files = set()
    for path in glob.glob(os.path.join(glob.escape(folder), prefix + "*")):
        if parse_spool_path(path) is not None:
            with contextlib.suppress(OSError):
                st = os.stat(path)
                files.add((st.st_dev, st.st_ino))
    fd_dir = f"/proc/{lr.pid}/fd"
    try:
        fds = os.listdir(fd_dir)
    except OSError as exc:
        return f"pid {lr.pid}: cannot read {fd_dir} to check it is rank {lr.rank} ({exc.strerror})"
    for fd in fds:
        with contextlib.suppress(OSError):
            st = os.stat(os.path.join(fd_dir, fd))
            if (st.st_dev, st.st_ino) in files:
                return None
    return f"pid {lr.pid} holds none of rank {lr.rank}'s spool files open (not that rank's process)"


class LocalRanks:
    """The live local ranks, rescanned at most every ``refresh_s`` seconds; thread-safe."""

    def __init__(self, spool_dir: str, refresh_s: float = 5.0) -> None:
        if refresh_s < 0:
            raise ValueError(f"refresh_s must be >= 0, got {refresh_s}")
        self.spool_dir = spool_dir
        self.refresh_s = refresh_s
        self._lock = threading.Lock()
        self._ranks: list[LocalRank] = []
        self._at = -float("inf")

    def get(self) -> list[LocalRank]:
        """Live local ranks (all runs), from a scan at most ``refresh_s`` old."""
        with self._lock:
            now = time.monotonic()
            if now - self._at >= self.refresh_s:
                self._ranks = scan_spool(self.spool_dir) if self.spool_dir else []
                self._at = now
            return list(self._ranks)

    def by_pid(self) -> dict[int, LocalRank]:
        """Live local ranks keyed by pid."""
        return {r.pid: r for r in self.get()}
