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
from ranksight.collectors.local_ranks import is_alive, run_place
from ranksight.collectors.sysfs import read_head
from ranksight.store.fit import fit_int
from ranksight.trainer_hooks.blackbox import HEADER, SLOT, parse_blackbox

log = logging.getLogger("ranksight.collectors.postmortem")

_FILE = re.compile(r"(blackbox|crash)-rank([0-9]{1,10})-([0-9]{1,10})\.(bin|txt)", re.ASCII)
MAX_STACK_CHARS = 200_000
"""Longest crash text kept (characters, as many bytes read at most); the rest is cut,
with a note."""
MAX_BLACKBOX_BYTES = HEADER.size + 4096 * SLOT.size
"""Largest black box read (4096 slots, 64 times what the hooks write): a bigger file is
no black box of ours and is not read."""
_OPS = {"group_seq": "UInt64", "numel_in": "UInt64", "numel_out": "UInt64", "bytes": "UInt64",
        "enqueue_ns": "Int64"}  # fmt: skip
"""Black-box op fields whose slot type (int64) is wider than their column."""


def _where(path: str) -> tuple[str, int, int, int] | None:
    """(run_id, attempt, rank, pid) named by a black box or crash file path; None for
    another file, a rank past ``2**31 - 1`` or a pid past ``2**32 - 1``."""
    place = run_place(path, _FILE)
    if place is None:
        return None
    run_id, attempt, m = place
    rank, pid = int(m.group(2)), int(m.group(3))
    return (run_id, attempt, rank, pid) if rank < 1 << 31 and pid < 1 << 32 else None


def gone_row(header: dict, run_id: str, attempt: int, rank: int, pid: int, host: str) -> dict:
    """The ``rank_ends`` row of a rank whose process ended without recording its end (the
    black box was not flushed): the step it was in (-1 when the box names none a column
    holds), the time of its last op or step."""
    step = fit_int(header["step"], "Int32")
    return {
        "run_id": run_id, "attempt": attempt, "rank": rank, "host": host, "pid": pid,
        "ts_ns": int(header["last_ns"]), "source": "agent", "reason": "gone", "code": -1,
        "detail": "the process ended without recording its end (killed outright?)",
        "last_step": step if step is not None else -1,
    }  # fmt: skip


def read_box(path: str) -> tuple[dict, list[dict]]:
    """:func:`~ranksight.trainer_hooks.blackbox.parse_blackbox` of the file at ``path``,
    read without waiting and within :data:`MAX_BLACKBOX_BYTES`. Raises ValueError naming
    the file if it is no black box (or a bigger one), OSError if it cannot be read (a
    folder, a FIFO: :class:`~ranksight.collectors.sysfs.NotAFile`)."""
    data = read_head(path, MAX_BLACKBOX_BYTES)
    if len(data) > MAX_BLACKBOX_BYTES:
        raise ValueError(f"{path}: more than {MAX_BLACKBOX_BYTES} bytes: no black box")
    return parse_blackbox(data, path)


def inflight_rows(path: str, run_id: str, attempt: int, rank: int) -> list[dict]:
    """``collectives`` rows of the ops in flight in black box ``path`` (none if the hooks
    flushed them). Raises ValueError/OSError as :func:`read_box` does."""
    return _inflight(read_box(path), path, run_id, attempt, rank)


def _inflight(box: tuple[dict, list[dict]], path: str, run_id: str, attempt: int, rank: int):
    header, ops = box
    if header["flushed"]:
        return []
    rows, garbage = [], 0
    for o in ops:
        if o["end_ns"] != 0 or o["enqueue_ns"] <= 0:
            continue
        if any(fit_int(o[k], t) != o[k] for k, t in _OPS.items()):
            garbage += 1  # a negative count or sequence number: a damaged slot
            continue
        rows.append({
            "run_id": run_id, "attempt": attempt, "rank": rank, "step": o["step"],
            "phase": o["phase"], "group_id": o["group_id"], "group_ranks": o["group_ranks"],
            "group_seq": o["group_seq"], "op": o["op"], "peer": o["peer"], "dtype": o["dtype"],
            "numel_in": o["numel_in"], "numel_out": o["numel_out"], "bytes": o["bytes"],
            "enqueue_ns": o["enqueue_ns"], "start_ns": o["enqueue_ns"], "end_ns": 0,
            "wait_ns": 0,
        })  # fmt: skip
    if garbage:
        log.warning("%s: %d in-flight ops with negative counts or sequence numbers left out",
                    path, garbage)  # fmt: skip
    return rows


def crash_row(path: str, run_id: str, attempt: int, rank: int, pid: int, host: str) -> dict | None:
    """A ``stacks`` row (trigger ``crash``) from a faulthandler file, None if it is empty.
    Raises OSError if it cannot be read (a folder, a FIFO: never waited on)."""
    data = read_head(path, MAX_STACK_CHARS)
    text = data.decode("utf-8", "replace")
    if not text.strip():
        return None
    if len(data) > MAX_STACK_CHARS:
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
                    box = read_box(path)
                    rows["collectives"] += _inflight(box, path, run_id, attempt, rank)
                    if not box[0]["flushed"]:
                        host = self.ctx.host
                        rows["rank_ends"].append(gone_row(box[0], run_id, attempt, rank, pid, host))
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
