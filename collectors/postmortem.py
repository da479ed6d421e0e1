"""What a rank killed outright leaves behind: its in-flight ops and its last Python stacks.

A hooked rank keeps a memory-mapped black box of its last ops
(``trainer_hooks/blackbox.py``) and has ``faulthandler`` write its stacks on a fatal
signal (``trainer_hooks/exits.py``), both beside its spool file. Once the rank's process
is gone, this collector reads them:

- the ops still in flight at death (issued, never completed) become ``collectives`` rows
  with ``end_ns`` 0, exactly as the hooks themselves write them on a SIGTERM; skipped when
  the hooks did write them (the black box says ``flushed``);
- a non-empty crash file becomes a ``stacks`` row, trigger ``crash``, its text as the
  summary;
- a black box the hooks did not flush means the process ended without recording its end:
  a ``rank_ends`` row (source ``agent``, reason ``gone``) with the step it was in.

Each file is handled once: it is renamed with a ``.shipped`` suffix after its rows are
handed to the agent's sink.
"""

from __future__ import annotations

import glob
import logging
import os
import re

from ranksight.collectors.base import Collector, NodeContext, Rows
from ranksight.collectors.local_ranks import is_alive
from ranksight.trainer_hooks.blackbox import read_blackbox

log = logging.getLogger("ranksight.collectors.postmortem")

_FILE = re.compile(r"^(blackbox|crash)-rank(\d+)-(\d+)\.(bin|txt)$")
_ATTEMPT = re.compile(r"^a(\d+)$")
MAX_STACK_CHARS = 200_000
"""Longest crash text kept (characters); the rest is cut, with a note."""


def _where(path: str) -> tuple[str, int, int, int] | None:
    """(run_id, attempt, rank, pid) named by a black box or crash file path."""
    m = _FILE.match(os.path.basename(path))
    a = _ATTEMPT.match(os.path.basename(os.path.dirname(path)))
    run_id = os.path.basename(os.path.dirname(os.path.dirname(path)))
    if not m or not a or not run_id:
        return None
    return run_id, int(a.group(1)), int(m.group(2)), int(m.group(3))


def gone_row(header: dict, run_id: str, attempt: int, rank: int, pid: int, host: str) -> dict:
    """The ``rank_ends`` row of a rank whose process ended without recording its end (the
    black box was not flushed): the step it was in, the time of its last op or step."""
    return {
        "run_id": run_id, "attempt": attempt, "rank": rank, "host": host, "pid": pid,
        "ts_ns": int(header["last_ns"]), "source": "agent", "reason": "gone", "code": -1,
        "detail": "the process ended without recording its end (killed outright?)",
        "last_step": int(header["step"]),
    }  # fmt: skip


def inflight_rows(path: str, run_id: str, attempt: int, rank: int) -> list[dict]:
    """``collectives`` rows of the ops in flight in black box ``path`` (none if the hooks
    flushed them). Raises ValueError/OSError as :func:`read_blackbox` does."""
    header, ops = read_blackbox(path)
    if header["flushed"]:
        return []
    return [
        {
            "run_id": run_id,
            "attempt": attempt,
            "rank": rank,
            "step": o["step"],
            "phase": o["phase"],
            "group_id": o["group_id"],
            "group_ranks": o["group_ranks"],
            "group_seq": o["group_seq"],
            "op": o["op"],
            "peer": o["peer"],
            "dtype": o["dtype"],
            "numel_in": o["numel_in"],
            "numel_out": o["numel_out"],
            "bytes": o["bytes"],
            "enqueue_ns": o["enqueue_ns"],
            "start_ns": o["enqueue_ns"],
            "end_ns": 0,
            "wait_ns": 0,
        }  # fmt: skip
        for o in ops
        if o["end_ns"] == 0 and o["enqueue_ns"] > 0
    ]


def crash_row(path: str, run_id: str, attempt: int, rank: int, pid: int, host: str) -> dict | None:
    """A ``stacks`` row (trigger ``crash``) from a faulthandler file, None if it is empty."""
    with open(path, errors="replace") as f:
        text = f.read(MAX_STACK_CHARS + 1)
    if not text.strip():
        return None
    if len(text) > MAX_STACK_CHARS:
        text = text[:MAX_STACK_CHARS] + "\n[cut]"
    return {
        "run_id": run_id, "attempt": attempt, "rank": rank, "host": host, "pid": pid,
        "ts_ns": int(os.stat(path).st_mtime_ns), "trigger": "crash", "native": 0, "ok": 1,
        "error": "", "threads": text.count("Thread 0x") or 1, "summary": text,
        "stack_json": "", "took_ms": 0.0,
    }  # fmt: skip


class PostmortemCollector(Collector):
    """Ships the black boxes and crash stacks of local ranks whose process is gone."""

    name = "postmortem"
    tables = ("collectives", "stacks", "rank_ends")
    interval_s = 2.0
    collect_on_stop = True
    """The agent collects once more when it stops: a job's ranks end just before it."""

    def __init__(self, ctx: NodeContext) -> None:
        self.ctx = ctx

    def collect(self, now_ns: int) -> Rows:
        """Rows of every file whose process ended since the last call."""
        rows: Rows = {"collectives": [], "stacks": [], "rank_ends": []}
        if not self.ctx.spool_dir:
            return rows
        pattern = os.path.join(glob.escape(self.ctx.spool_dir), "*", "a*", "*-rank*-*.*")
        for path in sorted(glob.glob(pattern)):
            where = _where(path)
            if where is None:
                continue
            run_id, attempt, rank, pid = where
            try:
                if is_alive(pid, os.stat(path).st_mtime):
                    continue
                if path.endswith(".bin"):
                    rows["collectives"] += inflight_rows(path, run_id, attempt, rank)
                    header, _ = read_blackbox(path)
                    if not header["flushed"]:
                        host = self.ctx.host
                        rows["rank_ends"].append(gone_row(header, run_id, attempt, rank, pid, host))
                else:
                    row = crash_row(path, run_id, attempt, rank, pid, self.ctx.host)
                    if row is not None:
                        rows["stacks"].append(row)
            except (OSError, ValueError) as e:
                log.warning("cannot read %s: %s", path, e)
            try:
                os.replace(path, path + ".shipped")
            except OSError as e:
                log.warning("cannot mark %s shipped: %s", path, e)
        return rows
