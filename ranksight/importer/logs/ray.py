"""Ray's raylet when a worker process dies::

    (raylet) A worker died or was killed while executing a task by an unexpected system
    error. ... Worker IP address: 10.164.204.17 ... Worker PID: 4156 ... Worker exit type:
    SYSTEM_ERROR ... [repeated 8x across cluster]

Each such line is a ``worker_died`` event: ``host`` the worker's address, ``pid`` its pid,
``code`` how many deaths it stands for (Ray folds repeats across the cluster).
"""

from __future__ import annotations

import re

from .events import Event
from .lines import LogLine

_DIED = re.compile(r"A worker died or was killed while executing a task")
_PID = re.compile(r"Worker PID: (?P<pid>\d+)")
_IP = re.compile(r"Worker IP address: (?P<ip>[\d.]+)")
_REPEATED = re.compile(r"\[repeated (?P<n>\d+)x across cluster\]")
MARKERS = ("A worker died",)


def parse(line: LogLine) -> list[Event]:
    """The ``worker_died`` event of one line, if it reports a death."""
    t = line.text
    if not _DIED.search(t):
        return []
    pid = int(p.group("pid")) if (p := _PID.search(t)) else -1
    ip = i.group("ip") if (i := _IP.search(t)) else ""
    n = int(r.group("n")) if (r := _REPEATED.search(t)) else 1
    return [Event("worker_died", rank=line.rank, local_rank=line.local_rank, host=ip or line.host,
                  pid=pid, line=line.number, code=n, text=t, detail={"repeated": n})]  # fmt: skip
