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
    """faulthandler and gdb ``py-bt`` dumps among a file's lines."""

    name = "pydumps"
    markers = MARKERS

    def __init__(self) -> None:
        self.dumps: list[dict] = []  # {rank, threads}
        self.current: dict | None = None  # the thread being read

    def feed(self, line: LogLine) -> None:
        """A dump's head starts a thread; its frame lines add to it."""
        t = line.text.strip()
        if m := _HEAD.match(t):
            name = "MainThread" if m.group("gdb") else m.group("tid")
            self.current = {"thread_name": name, "active": True, "frames": []}
            dump = self.dumps[-1] if self.dumps and self.dumps[-1]["rank"] == line.rank else None
            if dump is None or m.group("gdb"):
                dump = {"rank": line.rank, "threads": []}
                self.dumps.append(dump)
            dump["threads"].append(self.current)
        elif m := _GDB_THREAD.match(t):
            self._start(line, m.group("name") or f"thread {m.group('n')}")
        elif m := _GDB_FRAME.match(t):
            new = self.current is None or self.current.get("dump") != "gdb bt"
            if new or (m.group("n") == "0" and self.current is not None and self.current["frames"]):
                self._start(line, "thread")  # a bt with no thread header
            self._native(m)
        elif self.current is not None and len(self.current["frames"]) < MAX_FRAMES:
            if m := _FRAME.match(t):
                self.current["frames"].append({"name": m.group("name"), "filename": m.group("file"),
                                               "short_filename": _short(m.group("file")),
                                               "line": int(m.group("line"))})  # fmt: skip
            elif m := _BUILTIN.match(t):
                self.current["frames"].append({"name": m.group("name"), "filename": "<built-in>",
                                               "short_filename": "<built-in>", "line": 0})  # fmt: skip

    def _start(self, line: LogLine, name: str) -> None:
        """A new thread of a gdb backtrace (one dump per rank and backtrace)."""
        self.current = {"thread_name": name, "active": True, "frames": [], "dump": "gdb bt"}
        last = self.dumps[-1] if self.dumps else None
        if last is None or last["rank"] != line.rank or last.get("dump") != "gdb bt":
            last = {"rank": line.rank, "threads": [], "dump": "gdb bt"}
            self.dumps.append(last)
        last["threads"].append(self.current)

    def _native(self, m: re.Match) -> None:
        """One named frame of a gdb backtrace (``??`` frames are left out)."""
        if m.group("name") == "??" or self.current is None:
            return
        if len(self.current["frames"]) < MAX_FRAMES:
            file = m.group("file") or ""
            self.current["frames"].append({"name": m.group("name"), "filename": file,
                                           "short_filename": file.rsplit("/", 1)[-1],
                                           "line": int(m.group("line") or 0)})  # fmt: skip

    def finish(self) -> list[Event]:
        """One ``stack`` event per dump with frames."""
        out = []
        for d in self.dumps:
            threads = [t for t in d["threads"] if t["frames"]]
            if threads:
                native = d.get("dump") == "gdb bt"
                first = max(threads, key=lambda t: len(t["frames"])) if native else threads[0]
                e = event_of(d["rank"] if d["rank"] >= 0 else None, 0, [first], "", "log")
                e.detail["dump"] = d.get("dump") or (
                    "gdb py-bt" if threads[0]["thread_name"] == "MainThread" else "faulthandler"
                )
                e.detail["threads"] = len(threads)
                out.append(e)
        return out
