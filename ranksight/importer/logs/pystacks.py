"""py-spy dumps inside a console log (a rank's log, a job log that pasted them in): each
dump's threads become one ``stack`` event, as a file of its own would
(``importer/formats/pyspy.py``)::

    Process 52000: /usr/bin/python3 -u train.py
    Thread 52000 (idle): "MainThread"
        get (queue.py:180)
        _try_get_data (torch/utils/data/dataloader.py:1131)

The block's rank is its lines' launcher prefix where they have one; its pid the
``Process`` line's, where there is one.
"""

from __future__ import annotations

import re

from .events import Event
from .lines import LogLine

_PROCESS = re.compile(r"^Process (?P<pid>\d+):")
_THREAD = re.compile(
    r'^Thread (?P<tid>0x[0-9A-Fa-f]+|\d+) \((?P<state>[\w+]+)\)(?:: "(?P<name>[^"]*)")?'
)
_FRAME = re.compile(r"^(?P<name>\S.*?) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)\s*$")
MARKERS = ("Process ", "Thread ", " (", "(")


def _main_thread(threads: list[dict]) -> dict | None:
    """The thread that runs the training loop: ``MainThread`` by name, else the first."""
    named = [t for t in threads if t.get("thread_name") == "MainThread"]
    return (named or threads)[0] if named or threads else None


def _frame(f: dict) -> str:
    """``name (file:line)``; the line left out where unknown (0), the file too (native
    frames of a gdb backtrace may have neither)."""
    file = f.get("short_filename") or f.get("filename") or ""
    where = f"{file}:{f['line']}" if file and f.get("line") else file
    return f"{f.get('name', '?')} ({where})" if where else str(f.get("name", "?"))


def event_of(
    rank: int | None, pid: int, threads: list[dict], file: str, source: str = "file"
) -> Event:
    """The ``stack`` log event of one dump: ``detail.frames`` the main thread's innermost
    frames (up to 12, ``name (file:line)``), ``detail.active`` whether it was running,
    ``rank`` as the file name or the lines say (-1: not said); ``detail.source``: "file" (a
    dump of its own, also a ``stacks`` row) or "log" (pasted among a log's lines)."""
    main = _main_thread(threads) or {}
    frames = [_frame(f) for f in (main.get("frames") or [])[:12] if isinstance(f, dict)]
    return Event("stack", rank=-1 if rank is None else rank, pid=pid, file=file,
                 detail={"frames": frames, "active": bool(main.get("active")),
                         "threads": len(threads), "source": source},
                 text=frames[0] if frames else "")  # fmt: skip


class Reader:
    """py-spy dumps found among a file's lines."""

    name = "pystacks"
    markers = MARKERS

    def __init__(self) -> None:
        self.dumps: list[dict] = []  # {pid, rank, threads}
        self.current: dict | None = None

    def feed(self, line: LogLine) -> None:
        """A ``Process`` or ``Thread`` line starts a dump, a frame line adds to it."""
        t = line.text.strip()
        if m := _PROCESS.match(t):
            self.current = {"pid": int(m.group("pid")), "rank": line.rank, "threads": []}
            self.dumps.append(self.current)
        elif m := _THREAD.match(t):
            if self.current is None or (line.rank >= 0 and line.rank != self.current["rank"]):
                self.current = {"pid": 0, "rank": line.rank, "threads": []}
                self.dumps.append(self.current)
            self.current["threads"].append(
                {"thread_name": m.group("name") or "", "active": m.group("state").startswith("active"),
                 "owns_gil": "gil" in m.group("state"), "frames": []})  # fmt: skip
        elif self.current is not None and self.current["threads"] and (m := _FRAME.match(t)):
            self.current["threads"][-1]["frames"].append(
                {"name": m.group("name"), "filename": m.group("file"),
                 "short_filename": m.group("file"), "line": int(m.group("line") or 0)})  # fmt: skip
        elif t:
            self.current = None if not self.current or not self.current["threads"] else self.current

    def finish(self) -> list[Event]:
        """One ``stack`` event per dump with threads."""
        return [event_of(d["rank"] if d["rank"] >= 0 else None, d["pid"], d["threads"], "", "log")
                for d in self.dumps if d["threads"]]  # fmt: skip
