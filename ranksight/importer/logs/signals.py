"""A process that died of a fatal signal, as the crash handlers print it:

- UCX / HPC-X: ``[host:5283 :0:5704] Caught signal 7 (Bus error: nonexistent physical
  address)``;
- Python's faulthandler: ``Fatal Python error: Segmentation fault``;
- glog (c10's handler): ``*** SIGSEGV (@0x0) received by PID 1234 (TID 0x...) ***``;
- a shell: ``Segmentation fault (core dumped)``, ``Bus error (core dumped)``;
- the kernel's OOM killer (dmesg): ``Out of memory: Killed process 1234 (python)``.

Each is a ``fatal_signal`` event: ``code`` the signal number where the line gives it,
``op`` its name, ``host``/``pid`` where given (NCCL's lines of the same process then say
its device and rank), ``rank`` from the line's prefix.
"""

from __future__ import annotations

import re
import signal
from typing import Any

from .events import Event
from .lines import LogLine

_UCX = re.compile(r"\[(?P<host>[\w.-]+):(?P<pid>\d+)\s*:\d+:\d+\] Caught signal (?P<n>\d+)"
                  r" \((?P<name>[^):]+)")  # fmt: skip
_GLOG = re.compile(r"\*\*\* (?P<name>SIG[A-Z]+) \(@[^)]*\) received by PID (?P<pid>\d+)")
_PY = re.compile(r"Fatal Python error: (?P<name>Segmentation fault|Bus error|Aborted|"
                 r"Floating point exception|Illegal instruction)")  # fmt: skip
_OOM = re.compile(r"Out of memory: Kill(?:ed)? process (?P<pid>\d+) \((?P<comm>[^)]*)\)")
_SHELL = re.compile(r"^(?P<name>Segmentation fault|Bus error) \(core dumped\)")
_BY_NAME = {"Segmentation fault": signal.SIGSEGV, "Bus error": signal.SIGBUS,
            "Aborted": signal.SIGABRT, "Floating point exception": signal.SIGFPE,
            "Illegal instruction": signal.SIGILL}  # fmt: skip
MARKERS = ("Caught signal", "received by PID", "Fatal Python error", "(core dumped)",
           "Out of memory: Kill")  # fmt: skip


def _number(name: str) -> int:
    if name in _BY_NAME:
        return int(_BY_NAME[name])
    try:
        return int(signal.Signals[name])
    except KeyError:
        return -1


def parse(line: LogLine) -> list[Event]:
    """The ``fatal_signal`` event of one line, if it reports one."""
    t = line.text
    base: dict[str, Any] = dict(
        rank=line.rank, local_rank=line.local_rank, line=line.number, text=t
    )
    if m := _UCX.search(t):
        return [Event("fatal_signal", **base, host=m.group("host"), pid=int(m.group("pid")),
                      code=int(m.group("n")), op=m.group("name").strip())]  # fmt: skip
    if m := _GLOG.search(t):
        name = m.group("name")
        return [Event("fatal_signal", **base, host=line.host, pid=int(m.group("pid")),
                      code=_number(name), op=name)]  # fmt: skip
    if m := _OOM.search(t):  # the kernel's OOM killer (dmesg): SIGKILL
        host = line.host or (
            h.group(1) if (h := re.search(r"^\w{3}\s+\d+\s+[\d:]+\s+(\S+)\s+kernel:", t)) else ""
        )
        return [Event("fatal_signal", **base, host=host, pid=int(m.group("pid")),
                      code=int(signal.SIGKILL), op="SIGKILL (the kernel's OOM killer)",
                      detail={"command": m.group("comm")})]  # fmt: skip
    for pattern in (_PY, _SHELL):
        if m := pattern.search(t):
            name = m.group("name")
            return [Event("fatal_signal", **base, host=line.host, code=_number(name), op=name)]
    return []
