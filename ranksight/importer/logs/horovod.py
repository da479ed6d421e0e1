"""Horovod's stall inspector, printed by its coordinator (rank 0) when a collective waits
more than a minute for some ranks (horovod#364)::

    WARNING: One or more tensors were submitted to be reduced, gathered or broadcasted by
    subset of ranks and are waiting for remainder of ranks for more than 60 seconds. ...
    Stalled ops:
    allreduce.conv1.weight [ready ranks: 0, 7, 3, 2, 4, 6],

Each stalled op line is one ``timeout`` event per ready rank (it submitted the op and
waits in it: op from the tensor's prefix, group ``horovod``, no sequence number,
``detail.tensor``, ``detail.stall`` True). The ranks not ready say nothing themselves;
the hang detector makes them the suspects, as for any rank that left no line.
"""

from __future__ import annotations

import re

from ..rows import norm_op
from .events import Event
from .lines import LogLine

_STALLED = re.compile(
    r"(?P<op>allreduce|allgather|broadcast|alltoall|reducescatter)\.(?P<tensor>\S+?)\s*"
    r"\[(?:ready ranks|missing ranks): (?P<ranks>[\d,\s]+)\]"
)
MARKERS = ("ready ranks:",)
GROUP = "horovod"
"""The group name of Horovod's collectives (one global set of ranks)."""


def parse(line: LogLine) -> list[Event]:
    """One ``timeout`` event per ready rank of each stalled op the line names."""
    out = []
    for m in _STALLED.finditer(line.text):
        ranks = sorted({int(r) for r in re.findall(r"\d+", m.group("ranks"))})
        for r in ranks:
            out.append(Event("timeout", rank=r, host=line.host, line=line.number,
                             pg=GROUP, op=norm_op(m.group("op")), text=m.group(0),
                             detail={"tensor": m.group("tensor")[:80], "stall": True}))  # fmt: skip
    return out
