"""Which processes on this node are ranks: from the spool files they write, or the store.

Each hooked rank writes ``<spool>/<run_id>/a<attempt>/rank<rank:05d>-<pid>-<n>.spool``
segments (``trainer_hooks/spool.py``; older hooks: ``rank<rank:05d>-<pid>.jsonl``), so the
agent knows the local ranks and their pids without
asking anyone. A process counts as that rank while its pid is alive and was started no
later than the file was last written (a reused pid belongs to a younger process).
"""

from __future__ import annotations

import glob
import os
import re
import threading
import time
from dataclasses import dataclass

import psutil

_NAME = re.compile(r"^rank(\d+)-(\d+)(?:-(\d+)\.spool|\.jsonl)$")
_ATTEMPT = re.compile(r"^a(\d+)$")


@dataclass(frozen=True, slots=True)
class LocalRank:
    """One rank process on this node."""

    run_id: str
    attempt: int
    rank: int
    pid: int
    spool_path: str
    """Its spool file, the newest segment ("" when found through the store)."""


def parse_spool_path(path: str) -> LocalRank | None:
    """The rank a spool file path names, or None if the path is not a spool file."""
    name = os.path.basename(path)
    attempt_dir = os.path.basename(os.path.dirname(path))
    run_id = os.path.basename(os.path.dirname(os.path.dirname(path)))
    m, a = _NAME.match(name), _ATTEMPT.match(attempt_dir)
    if not m or not a or not run_id:
        return None
    return LocalRank(run_id, int(a.group(1)), int(m.group(1)), int(m.group(2)), path)


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
    """Live ranks of ``run_id`` that the ``ranks`` table places on ``host`` (latest
    attempt unless given). Raises StoreError if the store cannot be read."""
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
