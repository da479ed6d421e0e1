"""MPI launchers' reports of the process that failed first (a PyTorch job started by
``mpirun`` or ``horovodrun``: their ranks are the job's ranks):

- Open MPI: ``mpirun noticed that process rank 1 with PID 4242 on node gpu07 exited on
  signal 9 (Killed).`` (Aware-of-the-history#2), and the block after ``The first process
  to do so was:`` with ``Process name: [[62389,1],1]`` and ``Exit code: 1`` on lines of
  their own (Horovod repeats it: ``Process name: 1``, determined#3275);
- horovodrun: ``Process 0 exit with status code 137.`` (horovod#3472; 137 = 128 + SIGKILL).

Each becomes one ``child_failed`` event of that rank (``detail.source`` mpirun or
horovodrun, ``detail.signal`` where a signal ended it, ``detail.root_cause`` for the
first process to fail), read as torchrun's failure records are
(``analyzer/log_evidence/crash.py``). A pid or node the poster masked (``xxxxxx``) is
left out.
"""

from __future__ import annotations

import re

from .events import Event
from .lines import LogLine
from .torchrun import signal_name

_NOTICED = re.compile(
    r"mpirun(?:\.real)? noticed that process rank (?P<rank>\d+) with PID (?P<pid>\S+) on node "
    r"(?P<node>\S+) exited on signal (?P<sig>\d+)"
)
_HOROVODRUN = re.compile(r"Process (?P<rank>\d+) exit with status code (?P<code>\d+)\.")
_FIRST = re.compile(r"The first process to do so was")
_NAME = re.compile(r"Process name:\s*(?:\[\[\d+,\d+\],(?P<mpi>\d+)\]|(?P<plain>\d+)\b)")
_EXIT = re.compile(r"Exit code:\s*(?P<code>-?\d+)\b")
MARKERS = ("noticed that process rank", "exit with status code", "The first process to do so",
           "Process name:", "Exit code:")  # fmt: skip


def _int(text: str) -> int:
    return int(text) if text.isdigit() else -1


class Reader:
    """The launchers' failure reports of one file."""

    name = "mpi"
    markers = MARKERS

    def __init__(self) -> None:
        self.out: list[Event] = []
        self.first: dict | None = None  # the "first process to do so" block being read

    def feed(self, line: LogLine) -> None:
        """Read one line (see the module doc)."""
        t = line.text
        if m := _NOTICED.search(t):
            sig = int(m.group("sig"))
            node = m.group("node").rstrip(".")
            host = line.host or (node if "xxx" not in node else "")  # a masked node: none
            self.out.append(Event("child_failed", rank=int(m.group("rank")), pid=_int(m.group("pid")),
                                  code=-sig, host=host, line=line.number, text=t.strip(),
                                  detail={"source": "mpirun", "signal": signal_name(-sig),
                                          "root_cause": True}))  # fmt: skip
        elif m := _HOROVODRUN.search(t):
            status = int(m.group("code"))
            name = signal_name(128 - status) if status > 128 else ""
            self.out.append(Event("child_failed", rank=int(m.group("rank")),
                                  code=-(status - 128) if name else status, host=line.host,
                                  line=line.number, text=t.strip(),
                                  detail={"source": "horovodrun", "signal": name,
                                          "exit_status": status}))  # fmt: skip
        elif f := _FIRST.search(t):
            self.first = {"line": line.number, "host": line.host}
            self._block(t[f.end() :], line)  # a wrapped line may hold the block too
        elif self.first is not None:
            self._block(t, line)

    def _block(self, t: str, line: LogLine) -> None:
        """The rank and exit code of the first process to fail, in either order (Horovod
        prints the code first); one event once both are read."""
        if self.first is None:
            return
        if m := _NAME.search(t):
            self.first["rank"] = int(m.group("mpi") or m.group("plain"))
        if m := _EXIT.search(t):
            self.first["code"] = int(m.group("code"))
        if "rank" in self.first and "code" in self.first:
            f, self.first = self.first, None
            self.out.append(Event("child_failed", rank=f["rank"], code=f["code"], host=f["host"],
                                  line=f["line"], text=t.strip()[:200],
                                  detail={"source": "mpirun", "root_cause": True}))  # fmt: skip

    def finish(self) -> list[Event]:
        """The failures read."""
        return self.out
