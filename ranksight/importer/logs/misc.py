"""Lines that say who was there and how big the job is, and a rank's own exception.

- ``present``: every rank a line names by its prefix (one event per rank and file,
  ``count`` its lines): a rank that printed anything is not one that "left no line";
- ``world``: ``world_size=8``, ``WORLD_SIZE: 8``, ``global_world_size=16``, ``world size:
  8`` (``code`` the size, ``detail.source`` the words);
- ``exception``: the first lines per rank that raise a Python exception
  (``torch.OutOfMemoryError: CUDA out of memory``, ``RuntimeError: ...``): ``op`` the
  exception type, ``detail.message`` its first 200 characters.
"""

from __future__ import annotations

import re

from .events import Event
from .lines import LogLine

_WORLD = re.compile(
    r"\b(?P<key>global_world_size|role_world_size|world_size|WORLD_SIZE|world size|"
    r"num_processes|Total number of processes)\b\s*[=:]?\s*(?P<n>\d+)"
)
_EXC = re.compile(
    r"^\s*(?:\w+\.)*(?P<type>[A-Z]\w*(?:Error|Exception|Interrupt))(?::\s*(?P<msg>.*))?$"
)
MAX_EXCEPTIONS = 4
"""Exception lines kept per rank (the first ones: the later are mostly the same told again)."""


class Reader:
    """Presence, world size and exceptions of one file."""

    name = "misc"
    markers = ("",)

    def __init__(self) -> None:
        self.lines: dict[int, int] = {}
        self.first: dict[int, int] = {}
        self.out: list[Event] = []
        self.exc: dict[int, int] = {}

    def feed(self, line: LogLine) -> None:
        """Count the line's rank; read a world size or an exception."""
        if line.rank >= 0:
            self.lines[line.rank] = self.lines.get(line.rank, 0) + 1
            self.first.setdefault(line.rank, line.number)
        t = line.text
        if m := _WORLD.search(t):
            n = int(m.group("n"))
            if 0 < n <= 1_000_000:
                self.out.append(Event("world", rank=line.rank, code=n, line=line.number,
                                      text=t, detail={"source": m.group("key")}))  # fmt: skip
        if (m := _EXC.match(t)) and self.exc.get(line.rank, 0) < MAX_EXCEPTIONS:
            self.exc[line.rank] = self.exc.get(line.rank, 0) + 1
            self.out.append(Event("exception", rank=line.rank, local_rank=line.local_rank,
                                  host=line.host, line=line.number, op=m.group("type"), text=t,
                                  detail={"message": (m.group("msg") or "")[:200]}))  # fmt: skip

    def finish(self) -> list[Event]:
        """The file's events: one ``present`` per rank first."""
        present = [Event("present", rank=r, count=n, line=self.first[r])
                   for r, n in sorted(self.lines.items())]  # fmt: skip
        return present + self.out
