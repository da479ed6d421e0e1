"""What torchrun says about how a job's ranks ended: its ``ChildFailedError`` summary.

When a worker fails, torchrun's elastic agent stops the others (SIGTERM, then SIGKILL)
and prints a summary (``torch.distributed.elastic.multiprocessing.errors``)::

    Failures:
    [1]:
      time      : 2026-11-29_20:34:12
      host      : localhost
      rank      : 0 (local_rank: 0)
      exitcode  : -15 (pid: 30546)  (SIGTERM)
      error_file: <N/A>
      traceback : Signal 15 (SIGTERM) received by PID 30546
    ------------------------------------------------------------
    Root Cause (first observed failure):
    [0]:
      ...
      rank      : 6 (local_rank: 6)
      exitcode  : 17 (pid: 30552)

The root cause is the first failure torchrun observed; the "other failures" are mostly
the ranks it stopped. These become ``rank_ends`` rows (source ``launcher``), which the
analyzer weighs with what the ranks recorded themselves (analyzer/detectors/crash.py).
"""

from __future__ import annotations

import re
import signal
import time

_ENTRY = re.compile(
    r"(?:\[(\d+)\]:\s*\n\s*)?(?:time\s*:\s*(\S+)\s*\n\s*)?host\s*:\s*(\S+)\s*\n\s*rank\s*:\s*(\d+)"
    r"(?:\s*\(local_rank:\s*(\d+)\))?"
    r"[^\n]*\n\s*exitcode\s*:\s*(-?\d+)(?:\s*\(pid:\s*(\d+)\))?[^\n]*"
)


def torchrun_failures(text: str) -> list[dict]:
    """Every failure in torchrun's summary within ``text`` (a job's combined log), root
    cause first: ``{"rank", "local_rank", "exitcode", "pid", "host", "time",
    "root_cause"}`` (``local_rank`` -1 where the summary does not give it). An entry cut
    before its ``host`` line (a post that starts mid-list: no ``[N]:`` or ``time``) is
    read too, ``time`` "". Empty when the text has no summary."""
    root = text.rfind("Root Cause")
    start = text.rfind("Failures:", 0, root if root >= 0 else len(text))
    if root < 0 and start < 0:
        return []
    out, seen = [], set()
    for section, is_root in ((text[root:], True), (text[max(start, 0) : max(root, 0)], False)):
        if is_root and root < 0:
            continue
        for m in _ENTRY.finditer(section):
            rank = int(m.group(4))
            if rank in seen:
                continue
            seen.add(rank)
            out.append(
                {
                    "rank": rank,
                    "local_rank": int(m.group(5)) if m.group(5) else -1,
                    "exitcode": int(m.group(6)),
                    "pid": int(m.group(7) or 0),
                    "host": m.group(3),
                    "time": m.group(2) or "",
                    "root_cause": is_root,
                }
            )
    return out


def rank_end_rows(failures: list[dict], run_id: str, attempt: int = 0) -> list[dict]:
    """``rank_ends`` rows (source ``launcher``, reason ``exit_code``) for ``failures``."""
    now = time.time_ns()
    return [
        {
            "run_id": run_id,
            "attempt": attempt,
            "rank": f["rank"],
            "host": f["host"],
            "pid": f["pid"],
            "ts_ns": now,
            "source": "launcher",
            "reason": "exit_code",
            "code": f["exitcode"],
            "detail": "; ".join(
                p
                for p in (
                    "root cause (first observed failure)" if f["root_cause"] else "",
                    _signal_note(f["exitcode"]),
                )
                if p
            ),
            "last_step": -1,
        }
        for f in failures
    ]


def _signal_note(code: int) -> str:
    if code >= 0:
        return ""
    try:
        return f"killed by {signal.Signals(-code).name}"
    except ValueError:
        return f"killed by signal {-code}"


def record_failures(store, run_id: str, log_path: str, attempt: int = 0) -> list[dict]:
    """Parse torchrun's summary in ``log_path`` and store it as ``rank_ends`` rows;
    returns the failures (empty if the log has none or cannot be read)."""
    from ranksight.collectors.base import frame

    try:
        with open(log_path, errors="replace") as f:
            failures = torchrun_failures(f.read())
    except OSError:
        return []
    if failures:
        store.insert("rank_ends", frame("rank_ends", rank_end_rows(failures, run_id, attempt)))
    return failures
