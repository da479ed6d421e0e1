"""A rank's own Python exception: the first lines per rank that raise one
(``torch.OutOfMemoryError: CUDA out of memory``, ``RuntimeError: NCCL error in: ...``)
become ``exception`` events: ``op`` the exception type, ``detail.message`` its first 200
characters. Whether it caused the failure or followed it (``DistBackendError`` after a
timeout) the analyzer decides (``analyzer/log_evidence/crash.py``).

A rank's ``Traceback (most recent call last):`` (also cut: ``[rank2]: Traceback (most
recen``, vllm#10453) becomes one ``traceback`` event per rank: the rank raised something,
though its exception may be cut from the excerpt."""

from __future__ import annotations

import re

from .events import Event
from .lines import LogLine

_EXC = re.compile(
    r"^\s*(?:\w+\.)*(?P<type>[A-Z]\w*(?:Error|Exception|Interrupt))(?::\s*(?P<msg>.*))?$"
)
_TRACEBACK = "Traceback (most recent call last):"
MARKERS = ("Error", "Exception", "Interrupt", "Traceback (m")
MAX_PER_RANK = 4
"""Exception lines kept per rank (the first ones: the later are mostly the same again)."""


class Reader:
    """Exceptions of one file."""

    name = "exceptions"
    markers = MARKERS

    def __init__(self) -> None:
        self.seen: dict[int, int] = {}
        self.traced: set[int] = set()
        self.out: list[Event] = []

    def feed(self, line: LogLine) -> None:
        """Read an exception line, or a rank's first traceback head."""
        head = line.text.strip()
        if line.rank >= 0 and len(head) >= 11 and _TRACEBACK.startswith(head[:34]):
            if line.rank not in self.traced:
                self.traced.add(line.rank)
                self.out.append(Event("traceback", rank=line.rank, host=line.host,
                                      line=line.number, text=head))  # fmt: skip
            return
        m = _EXC.match(line.text)
        if not m or self.seen.get(line.rank, 0) >= MAX_PER_RANK:
            return
        self.seen[line.rank] = self.seen.get(line.rank, 0) + 1
        self.out.append(Event("exception", rank=line.rank, local_rank=line.local_rank,
                              host=line.host, line=line.number, op=m.group("type"),
                              text=line.text, detail={"message": (m.group("msg") or "")[:200]}))  # fmt: skip

    def finish(self) -> list[Event]:
        """The exceptions read."""
        return self.out
