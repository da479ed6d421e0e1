"""What other analyzers already concluded: PyTorch's ``fr_trace`` text and NCCL's RAS.

- ``fr_trace`` (torch/distributed/flight_recorder), old and new wording::

      Not all ranks joining collective 3 at entry 2          | ...: sequence number: 31117
      group info: 0:default_pg
      collective: nccl:all_reduce
      missing ranks: {1}
      expected ranks: 2                                      | {0, 1, 2, 3, 4, 5, 6, 7}

- NCCL RAS (``ncclras``, NCCL >= 2.24), per communicator::

      #0-0 (fa93daea854b060b) MISMATCH
        30 ranks have launched up to operation 640
        2 ranks have launched up to operation 641
        Rank 12 -- GPU 4 managed by process 323032 on node 10.137.190.124

Each ``fr_trace`` block is one ``fr_missing`` event (``detail``: missing and expected
ranks, ``source`` fr_trace); each RAS count whose ranks are listed is one ``fr_missing``
event too (``detail``: the listed ranks, their operation count and the other counts,
``source`` ras), and each process RAS could get no data from ("Missing communicator data
from 1 job process" / "Process 60004 on node 10.4.109.13 managing GPU 0") one with its
host and pid (``source`` ras_unreachable). Ranks are global in both.
"""

from __future__ import annotations

import re

from ..rows import norm_op
from .events import Event
from .lines import LogLine

_JOIN = re.compile(r"Not all ranks joining collective:?\s*(?:sequence number:\s*)?(?P<seq>\d+)")
_GROUP = re.compile(r"^\s*group info:\s*(?P<pg>[^:\s]+)(?::(?P<name>\S+))?")
_COLL = re.compile(r"^\s*collective:\s*(?P<op>\S+)")
_MISSING = re.compile(r"missing ranks:\s*\{(?P<ranks>[\d,\s]*)\}")
_EXPECTED = re.compile(r"expected ranks:\s*(?:\{(?P<ranks>[\d,\s]*)\}|(?P<n>\d+))")
_WORLD = re.compile(r"^\s*world size:\s*(?P<n>\d+)")
_LAUNCHED = re.compile(r"(?P<n>\d+) ranks? ha(?:ve|s) launched up to operation (?P<op>\d+)")
_RAS_RANK = re.compile(r"^\s*Rank (?P<r>\d+) -- GPU (?P<gpu>\d+) managed by process (?P<pid>\d+)"
                       r"(?: on node (?P<node>\S+))?")  # fmt: skip
_NO_DATA = re.compile(r"Missing communicator data from (?P<n>\d+) job process")
_PROCESS = re.compile(
    r"^\s*Process (?P<pid>\d+) on node (?P<node>\S+)(?: managing GPU (?P<gpu>\d+))?"
)
_COMM = re.compile(r"^#(?P<comm>\d+-\d+) \((?P<hash>[0-9a-f]+)\)")


def _ints(text: str | None) -> list[int]:
    return [int(x) for x in re.findall(r"\d+", text or "")]


class Reader:
    """Reads ``fr_trace`` blocks and RAS communicator blocks of one file."""

    name = "fr_trace"
    markers = ("Not all ranks joining", "group info:", "collective:", "missing ranks", "expected",
               "world size", "launched up to operation", " -- GPU ", "#", "Missing communicator",
               "Process ")  # fmt: skip

    def __init__(self) -> None:
        self.out: list[Event] = []
        self.block: Event | None = None
        self.counts: list[tuple[int, int]] = []  # RAS: (ranks, operation)
        self.comm = ""
        self.silent = False  # inside RAS's "Missing communicator data from N job process"

    def feed(self, line: LogLine) -> None:
        """Take one line of a block."""
        t = line.text
        if m := _JOIN.search(t):
            self.block = Event("fr_missing", seq=int(m.group("seq")), line=line.number, text=t,
                               detail={"source": "fr_trace"})  # fmt: skip
            self.out.append(self.block)
            return
        if m := _COMM.match(t.strip()):
            self.comm, self.counts = m.group("comm"), []
            return
        if _NO_DATA.search(t):
            self.silent = True
            return
        if (m := _PROCESS.match(t)) and self.silent:
            self.out.append(Event("fr_missing", host=m.group("node"), pid=int(m.group("pid")),
                                  line=line.number, text=t,
                                  detail={"source": "ras_unreachable",
                                          "gpu": int(m.group("gpu") or -1)}))  # fmt: skip
            return
        self.silent = False
        if m := _LAUNCHED.search(t):
            self.counts.append((int(m.group("n")), int(m.group("op"))))
            return
        if (m := _RAS_RANK.match(t)) and self.counts:
            self._ras_rank(m, line)
            return
        b = self.block
        if b is None:
            return
        if m := _GROUP.match(t):
            b.pg, b.pg_name = m.group("pg"), m.group("name") or ""
        elif m := _COLL.match(t):
            b.op = norm_op(m.group("op"))
        elif m := _MISSING.search(t):
            b.detail["missing"] = _ints(m.group("ranks"))
        elif m := _EXPECTED.search(t):
            b.detail["expected"] = _ints(m.group("ranks")) if m.group("ranks") else []
            b.code = int(m.group("n")) if m.group("n") else len(b.detail["expected"])
        elif m := _WORLD.match(t):
            b.code = int(m.group("n"))

    def _ras_rank(self, m: re.Match, line: LogLine) -> None:
        """A listed rank belongs to the smallest count printed so far (RAS lists the ranks
        of the minority count)."""
        n, op = min(self.counts)
        self.out.append(
            Event("fr_missing", rank=int(m.group("r")), seq=op, host=m.group("node") or "",
                  pid=int(m.group("pid")), pg=self.comm, line=line.number, text=line.text,
                  detail={"source": "ras", "counts": self.counts, "gpu": int(m.group("gpu"))})
        )  # fmt: skip

    def finish(self) -> list[Event]:
        """The blocks read (an ``fr_trace`` block without missing ranks is left out)."""
        return [
            e for e in self.out if e.detail.get("source") != "fr_trace" or "missing" in e.detail
        ]
