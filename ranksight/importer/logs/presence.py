"""Lines that say who was there and how big the job is.

- ``present``: every rank a line names by its prefix (one event per rank and file,
  ``count`` its lines): a rank that printed anything is not one that "left no line";
- ``world``: ``world_size=8``, ``WORLD_SIZE: 8``, ``global_world_size=16``, ``world size:
  8`` (``code`` the size, ``detail.source`` the words);
- ``nodes``: ``--nnodes=2``, ``nnodes 2``, ``NNODES=2``, ``--nnodes=1:4`` (torchrun's
  elastic range: the largest), where more than one: the job spans several nodes, so a
  local rank is not the global rank (``analyzer/log_evidence/evidence.py``);
- ``world`` from a torchrun command line that fixes both ``--nnodes=2`` (no elastic
  ``1:4`` range) and ``--nproc_per_node=1`` (a number, not ``auto``/``gpu``): their
  product, ``detail.source`` ``torchrun --nnodes x --nproc_per_node`` (chitu#80: both
  nodes' commands say ``--nnodes=2 --nproc_per_node=1``, world 2).
"""

from __future__ import annotations

import re

from .events import Event
from .lines import LogLine

_WORLD = re.compile(
    r"\b(?P<key>global_world_size|role_world_size|world_size|WORLD_SIZE|world size|"
    r"num_processes|Total number of processes)\b\s*[=:]?\s*(?P<n>\d+)"
)
_NODES = re.compile(
    r"\b(?:nnodes|NNODES|num_nodes|NUM_NODES)\b[\"']?\s*[=:]?\s*(?:\d+:)?(?P<n>\d+)"
)
_LAUNCH = re.compile(r"\b(?:torchrun|torch\.distributed\.(?:run|launch))\b")
_FIXED_NODES = re.compile(r"--nnodes[= ](?P<n>\d+)(?![\d:])")
_PER_NODE = re.compile(r"--nproc[_-]per[_-]node[= ](?P<n>\d+)(?!\w)")
MARKERS = ("",)
"""Every line: any line with a rank prefix counts as that rank's presence."""
MAX_WORLD = 1_000_000


def launched_world(text: str) -> int:
    """The world size a torchrun command line fixes (``--nnodes=2 --nproc_per_node=1``:
    2), or 0 where it fixes none (no launcher word, an elastic ``--nnodes=1:4``, no
    number of processes per node)."""
    if not _LAUNCH.search(text):
        return 0
    nodes, per = _FIXED_NODES.search(text), _PER_NODE.search(text)
    if not nodes or not per:
        return 0
    n = int(nodes.group("n")) * int(per.group("n"))
    return n if 0 < n <= MAX_WORLD else 0


class Reader:
    """Presence and world size of one file."""

    name = "presence"
    markers = MARKERS

    def __init__(self) -> None:
        self.lines: dict[int, int] = {}
        self.first: dict[int, int] = {}
        self.out: list[Event] = []

    def feed(self, line: LogLine) -> None:
        """Count the line's rank; read a world size."""
        if line.rank >= 0:
            self.lines[line.rank] = self.lines.get(line.rank, 0) + 1
            self.first.setdefault(line.rank, line.number)
        if m := _WORLD.search(line.text):
            n = int(m.group("n"))
            if 0 < n <= MAX_WORLD:
                self.out.append(Event("world", rank=line.rank, code=n, line=line.number,
                                      text=line.text, detail={"source": m.group("key")}))  # fmt: skip
        if n := launched_world(line.text):
            self.out.append(Event("world", rank=line.rank, code=n, line=line.number,
                                  text=line.text[:200],
                                  detail={"source": "torchrun --nnodes x --nproc_per_node"}))  # fmt: skip
        if (m := _NODES.search(line.text)) and 1 < int(m.group("n")) <= MAX_WORLD:
            self.out.append(Event("nodes", rank=line.rank, code=int(m.group("n")),
                                  line=line.number, text=m.group(0)))  # fmt: skip

    def finish(self) -> list[Event]:
        """One ``present`` event per rank, then the world sizes."""
        present = [Event("present", rank=r, count=n, line=self.first[r])
                   for r, n in sorted(self.lines.items())]  # fmt: skip
        return present + self.out
