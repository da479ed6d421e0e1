"""Decide that a rank stopped making progress, and take the stacks of its run's local ranks.

A hooked rank appends records to its spool segment at every step, phase and collective
(a frame per table per flush); its writer thread also appends ``progress`` snapshots every
few seconds, even while the training thread is stuck. So a rank made progress when
anything but ``progress`` records was appended. A rank whose process is alive and that made none for ``stall_s`` seconds is
stuck — in a collective whose peers never came, in a data loader, in a deadlock. The
watcher then dumps every local rank of that run with py-spy at once (trigger
``no_progress``) — the stuck one and the ones waiting for it, so the odd stack out can be
seen — once per stall: again only after the run has progressed in between. It also asks
the run's ranks for a Flight Recorder dump (``trainer_hooks.flight_recorder``), which the
``fr`` collector ingests.

A rank whose process is stopped (state ``T``: SIGSTOP, SIGTSTP; ``t``: held by a
debugger; read from ``/proc/PID/stat`` through psutil) writes nothing, as a dead one
would, but it is alive: the watcher writes a ``stacks`` row with trigger ``stopped``
(``ok`` 0, the state in ``summary``) when it sees the stop, and one with trigger
``continued`` when it runs again, so the analysis can tell a stopped rank (a hang) from a
crashed one. A stopped rank is never dumped with py-spy (attaching to it could resume it).
"""

from __future__ import annotations

import logging
import os
import time

import psutil

from ranksight.collectors.base import Collector, NodeContext, Rows
from ranksight.collectors.local_ranks import LocalRank, LocalRanks
from ranksight.collectors.pyspy import PySpyConfig, StackTaker
from ranksight.trainer_hooks import spool_format as sf

log = logging.getLogger("ranksight.agent.stall")


class StallWatcher(Collector):
    """Checks the local ranks' spool files every ``interval_s``; see the module doc."""

    name = "stacks"
    tables = ("stacks",)

    def __init__(
        self,
        ctx: NodeContext,
        *,
        stall_s: float = 60.0,
        interval_s: float = 5.0,
        pyspy: PySpyConfig | None = None,
        local_ranks: LocalRanks | None = None,
    ) -> None:
        if stall_s <= 0 or interval_s <= 0:
            raise ValueError(f"stall_s and interval_s must be > 0, got {stall_s}, {interval_s}")
        self.ctx = ctx
        self.stall_s = stall_s
        self.interval_s = interval_s
        self.pyspy = pyspy
        self.local_ranks = local_ranks or LocalRanks(ctx.spool_dir)
        self.taker: StackTaker | None = None
        self._seen: dict[str, tuple[int, float]] = {}
        """Per spool file: offset read up to, and when the rank last made progress."""
        self._dumped: set[tuple[str, int]] = set()
        self._stopped: dict[str, str] = {}
        """Spool file -> the stopped state its rank was last seen in."""

    def open(self) -> None:
        """Find py-spy; raises Unavailable without it."""
        self.taker = StackTaker(self.ctx.host, self.pyspy)

    def stalled(self, ranks: list[LocalRank], now: float) -> set[tuple[str, int]]:
        """Runs ``(run_id, attempt)`` with a rank that appended nothing but ``progress``
        records for ``stall_s`` seconds (``now``: ``time.monotonic()``)."""
        stuck, seen = set(), set()
        for lr in ranks:
            seen.add(lr.spool_path)
            last = self._seen.get(lr.spool_path)
            offset, moved = appended_progress(lr.spool_path, last[0] if last else None)
            if last is None or moved:
                self._seen[lr.spool_path] = (offset, now)
                continue
            self._seen[lr.spool_path] = (offset, last[1])
            if now - last[1] >= self.stall_s:
                stuck.add((lr.run_id, lr.attempt))
        for path in set(self._seen) - seen:
            del self._seen[path]
        return stuck

    def collect(self, now_ns: int) -> Rows:
        """``stacks`` rows of every run that newly stalled."""
        ranks = self.local_ranks.get()
        rows = self.state_changes(ranks, now_ns)
        stuck = self.stalled(ranks, time.monotonic())
        self._dumped &= stuck  # a run that moved again may be dumped at its next stall
        for run in sorted(stuck - self._dumped):
            self._dumped.add(run)
            mine = [lr for lr in ranks if (lr.run_id, lr.attempt) == run]
            self._request_fr_dump(mine)
            running = [lr for lr in mine if lr.spool_path not in self._stopped]
            if self.taker is None:
                raise RuntimeError("StallWatcher.collect() called before open()")
            rows.extend(self.taker.take(running, "no_progress"))
        return {"stacks": rows}

    def state_changes(self, ranks: list[LocalRank], now_ns: int) -> list[dict]:
        """``stacks`` rows (trigger ``stopped`` / ``continued``) for the ranks whose
        process stopped or ran again since the last look."""
        rows, seen = [], set()
        for lr in ranks:
            seen.add(lr.spool_path)
            state, was = stopped_state(lr.pid), self._stopped.get(lr.spool_path)
            if state and not was:
                self._stopped[lr.spool_path] = state
                rows.append(self._state_row(lr, now_ns, "stopped", state))
            elif was and not state:
                del self._stopped[lr.spool_path]
                rows.append(self._state_row(lr, now_ns, "continued", f"running again ({was})"))
        for path in set(self._stopped) - seen:
            del self._stopped[path]
        return rows

    def _state_row(self, lr: LocalRank, now_ns: int, trigger: str, summary: str) -> dict:
        return {"run_id": lr.run_id, "attempt": lr.attempt, "rank": lr.rank,
                "host": self.ctx.host, "pid": lr.pid, "ts_ns": now_ns, "trigger": trigger,
                "native": 0, "ok": 0, "error": "", "threads": 0, "summary": summary,
                "stack_json": "", "took_ms": 0.0}  # fmt: skip

    @staticmethod
    def _request_fr_dump(ranks: list[LocalRank]) -> None:
        """Ask the run's ranks for a Flight Recorder dump (the hooks' writer thread writes
        it where torch would; the ``fr`` collector ingests it)."""
        from ranksight.trainer_hooks.flight_recorder import request_dump

        for run_dir in sorted({os.path.dirname(lr.spool_path) for lr in ranks}):
            try:
                request_dump(run_dir)
            except OSError as exc:
                log.warning("cannot ask %s for a Flight Recorder dump: %s", run_dir, exc)


STOPPED_STATES = {
    psutil.STATUS_STOPPED: "state T: stopped by a signal (SIGSTOP, SIGTSTP)",
    psutil.STATUS_TRACING_STOP: "state t: stopped by a debugger (ptrace)",
}
"""psutil's process status -> what it means, for the states of a stopped, live process."""


def stopped_state(pid: int) -> str:
    """What stops process ``pid`` (:data:`STOPPED_STATES`), or ``""`` if it runs, sleeps
    or is gone. Reads ``/proc/PID/stat`` (psutil)."""
    try:
        return STOPPED_STATES.get(psutil.Process(pid).status(), "")
    except psutil.Error:
        return ""


HEARTBEAT = b'{"t":"progress"'
"""How a ``progress`` snapshot line of a JSON spool file starts (compact JSON)."""
_LOOK_BYTES = 1 << 16


def appended_progress(path: str, offset: int | None) -> tuple[int, bool]:
    """``(new offset, progressed)``: whether complete lines appended to ``path`` after
    ``offset`` hold a record other than a ``progress`` snapshot. The new offset is just
    after the last complete line. More than 64 KiB appended counts as progress unread
    (snapshots are a few hundred bytes every few seconds). ``offset`` None: the first look,
    which only finds the end."""
    try:
        size = os.stat(path).st_size
        if offset is None or size < offset:
            return size, offset is not None
        if size - offset > _LOOK_BYTES:
            return size, True
        with open(path, "rb") as f:
            f.seek(offset)
            chunk = f.read(size - offset)
    except OSError:
        return offset or 0, False
    if path.endswith(sf.SUFFIX):  # binary segment: the frames' table names tell
        end, moved = 0, False
        for item in sf.frames(chunk, 0):
            end = item.end
            if isinstance(item, sf.Frame) and item.kind in (sf.COLUMNS, sf.JSON_LINES):
                moved = moved or item.name != "progress"
        return offset + end, moved
    end = chunk.rfind(b"\n") + 1
    lines = chunk[:end].splitlines()
    return offset + end, any(line and not line.startswith(HEARTBEAT) for line in lines)
