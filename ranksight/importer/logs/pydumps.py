"""Python stacks of a hung process as faulthandler and gdb print them (not py-spy's:
``pystacks.py``), pasted into a console or a file of their own:

- faulthandler (``faulthandler.dump_traceback``, ``py-spy``-less hang dumps, DeepSpeed#860)::

      Thread 0x00007f57caf71740 (most recent call first):
        File ".../torch/cuda/streams.py", line 95 in synchronize
        File ".../deepspeed/runtime/zero/stage3.py", line 490 in _synchronize_communication

  (``Current thread 0x... (most recent call first):`` for the thread that dumped);
- gdb's ``py-bt`` (DeepSpeed#1969)::

      Traceback (most recent call first):
        <built-in method allreduce of PyCapsule object at remote 0x7fb3b12c3f90>
        File ".../torch/distributed/distributed_c10d.py", line 1209, in all_reduce
          work = group.allreduce([tensor], opts)

- gdb's native ``bt`` (``thread apply all bt``; nccl#1550, pytorch#95944)::

      Thread 16 (Thread 0x7f083d7fe000 (LWP 1705707) "executionLoop"):
      #6  0x00007f1431c6674d in cudaStreamQuery () from .../libnvinfer_plugin_tensorrt_llm.so
      #7  0x00007f1431bdb43b in tensorrt_llm::plugins::AllgatherPlugin::enqueue(...)

  (frames without a symbol, ``?? ()``, are left out; of its threads, the one with the
  most named frames).

Innermost frame first in all. Each dump becomes one ``stack`` event, as a py-spy dump
does (:func:`.pystacks.event_of`, ``detail.source`` "log"): the frames of its first
thread (faulthandler lists the main thread's stack where it dumped all threads; the
current thread's when that is the only one). The rank is the lines' launcher prefix.
"""

from __future__ import annotations

import re

from .events import Event
from .lines import LogLine
from .pystacks import event_of

_HEAD = re.compile(
    r"^(?:(?P<current>Current thread)|Thread) (?P<tid>0x[0-9A-Fa-f]+) \(most recent call first\):"
    r"|^(?P<gdb>Traceback \(most recent call first\):)"
)
_FRAME = re.compile(r'^File "(?P<file>[^"]+)", line (?P<line>\d+),? in (?P<name>\S+)')
_BUILTIN = re.compile(r"^<built-in method (?P<name>\w+)")
_GDB_THREAD = re.compile(
    r'^Thread (?P<n>\d+) \(Thread 0x[0-9A-Fa-f]+ \(LWP \d+\)(?: "(?P<name>[^"]*)")?\):'
)
_GDB_FRAME = re.compile(
    r"^#(?P<n>\d+)\s+(?:0x[0-9A-Fa-f]+ in )?(?P<name>[^\s(]+)\s*\(.*?\)"
    r"(?:\s+(?:at|from) (?P<file>\S+?)(?::(?P<line>\d+))?)?\s*$"
)
MARKERS = ("(most recent call first)", 'File "', "<built-in method", "#", "(LWP ")
MAX_FRAMES = 64


def _short(path: str) -> str:
    """A frame's file as py-spy shortens it: from the package on (after ``site-packages/``),
    else its last two parts."""
    if "site-packages/" in path:
        return path.rsplit("site-packages/", 1)[1]
    return "/".join(path.split("/")[-2:])


class Reader:
    """faulthandler and gdb dumps among a file's lines."""

    name = "pydumps"
    markers = MARKERS

    def __init__(self) -> None:
        self.dumps: list[dict] = []  # {rank, kind, threads}
        self.current: dict | None = None  # the thread being read
        self.kind = ""  # the kind of dump it belongs to

    def feed(self, line: LogLine) -> None:
        """A dump's head starts a thread; its frame lines add to it."""
        t = line.text.strip()
        if m := _HEAD.match(t):
            if m.group("gdb"):
                self._open(line, "MainThread", "gdb py-bt")
            else:
                self._open(line, m.group("tid"), "faulthandler")
        elif m := _GDB_THREAD.match(t):
            self._open(line, m.group("name") or f"thread {m.group('n')}", "gdb bt")
        elif m := _GDB_FRAME.match(t):
            again = m.group("n") == "0" and self.current is not None and self.current["frames"]
            if self.kind != "gdb bt" or again:
                self._open(line, "thread", "gdb bt")  # a bt with no thread header
            if m.group("name") != "??":
                file = m.group("file") or ""
                self._add(m.group("name"), file, file.rsplit("/", 1)[-1], int(m.group("line") or 0))
        elif self.current is not None:
            if m := _FRAME.match(t):
                file = m.group("file")
                self._add(m.group("name"), file, _short(file), int(m.group("line")))
            elif m := _BUILTIN.match(t):
                self._add(m.group("name"), "<built-in>", "<built-in>", 0)

    def _open(self, line: LogLine, name: str, kind: str) -> None:
        """A new thread: of the last dump where it is the same rank's and kind's (a
        faulthandler or native dump of all threads; each ``py-bt`` is a dump of its own)."""
        self.current, self.kind = {"thread_name": name, "active": True, "frames": []}, kind
        last = self.dumps[-1] if self.dumps else None
        if last is None or (last["rank"], last["kind"]) != (line.rank, kind) or kind == "gdb py-bt":
            last = {"rank": line.rank, "kind": kind, "threads": []}
            self.dumps.append(last)
        last["threads"].append(self.current)

    def _add(self, name: str, file: str, short: str, line: int) -> None:
        """One frame of the thread being read (at most :data:`MAX_FRAMES`)."""
        if self.current is not None and len(self.current["frames"]) < MAX_FRAMES:
            self.current["frames"].append(
                {"name": name, "filename": file, "short_filename": short, "line": line}
            )

    def finish(self) -> list[Event]:
        """One ``stack`` event per dump with frames: its first thread's, or for a native
        backtrace the thread with the most named frames."""
        out = []
        for d in self.dumps:
            threads = [t for t in d["threads"] if t["frames"]]
            if threads:
                native = d["kind"] == "gdb bt"
                first = max(threads, key=lambda t: len(t["frames"])) if native else threads[0]
                e = event_of(d["rank"] if d["rank"] >= 0 else None, 0, [first], "", "log")
                e.detail["dump"], e.detail["threads"] = d["kind"], len(threads)
                out.append(e)
        return out
