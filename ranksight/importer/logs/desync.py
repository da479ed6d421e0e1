"""Desync reports that name ranks outright.

- ``TORCH_NCCL_DESYNC_DEBUG=1`` (ProcessGroupNCCL's ``retrieveDesyncReport``, TraceUtils.h)::

      - To our best knowledge, ranks [3, 5] are the lagging ranks that caused this timeout.
      - [7] finished collective #182, but didn't join collective #183 (count from 1)
      - [0, 1] joined but didn't finish collective #183 (count from 1)

- ``TORCH_DISTRIBUTED_DEBUG=DETAIL``'s collective fingerprints (ProcessGroupWrapper)::

      Detected mismatch between collectives on ranks. Rank 0 is running collective:
      CollectiveFingerPrint(SequenceNumber=40, OpType=ALLREDUCE, TensorShape=[1], ...),
      but Rank 1 is running collective: CollectiveFingerPrint(SequenceNumber=40OpType=BARRIER).

  (the other rank's short form runs the fields together). Ranks here are of the
  wrapped group; the global rank is the line's prefix where there is one.
"""

from __future__ import annotations

import re
from typing import Any

from ..rows import norm_op
from .events import Event
from .lines import LogLine

MARKERS = ("lagging", "didn't join", "didn't finish", "never joined", "CollectiveFingerPrint",
           "mismatch between collectives")  # fmt: skip
_LIST = r"\[(?P<ranks>\d+(?:\s*,\s*\d+)*)\]"
_LAGGING = re.compile(r"ranks? " + _LIST + r" (?:are|is) the lagging rank")
_FINISHED = re.compile(
    _LIST + r" finished collective #(?P<done>\d+),? but didn'?t join collective #(?P<seq>\d+)"
)
_JOINED = re.compile(_LIST + r" joined but didn'?t finish collective #(?P<seq>\d+)")
_NEVER = re.compile(r"ranks? " + _LIST + r"[^.]*?never joined")
_PRINT = re.compile(
    r"Rank (?P<rank>\d+) is running (?:collective|inconsistent collective):\s*"
    r"CollectiveFingerPrint\((?P<fp>[^()]*(?:\([^()]*\)[^()]*)*)\)?"
)
_FP = {
    "seq": re.compile(r"SequenceNumber=\s*(\d+)"),
    "op": re.compile(r"OpType=\s*(\w+)"),
    "shape": re.compile(r"TensorShape=\s*(\[[^\]]*\](?:,\s*\[[^\]]*\])*)"),
    "dtype": re.compile(r"TensorDtypes=\s*([\w, ]+?)(?:,\s*\w+=|$)"),
}


def _ranks(text: str) -> list[int]:
    return [int(x) for x in re.findall(r"\d+", text)]


def parse(line: LogLine) -> list[Event]:
    """``desync_report`` and ``mismatch`` events of one logical line."""
    text, out = line.text, []
    base: dict[str, Any] = dict(host=line.host, line=line.number, text=text)
    for pattern, verdict in ((_LAGGING, "lagging"), (_NEVER, "never_joined")):
        for m in pattern.finditer(text):
            for r in _ranks(m.group("ranks")):
                out.append(Event("desync_report", rank=r, peer=line.rank, **base,
                                 detail={"verdict": verdict}))  # fmt: skip
    for m in _FINISHED.finditer(text):
        for r in _ranks(m.group("ranks")):
            out.append(Event("desync_report", rank=r, peer=line.rank, seq=int(m.group("seq")),
                             completed=int(m.group("done")), **base,
                             detail={"verdict": "did_not_join"}))  # fmt: skip
    for m in _JOINED.finditer(text):
        for r in _ranks(m.group("ranks")):
            out.append(Event("desync_report", rank=r, peer=line.rank, seq=int(m.group("seq")),
                             **base, detail={"verdict": "did_not_finish"}))  # fmt: skip
    prints = list(_PRINT.finditer(text))
    if len(prints) == 1:  # the other rank's half is cut off
        m = prints[0]
        fa = {k: (x.group(1) if (x := r.search(m.group("fp"))) else "") for k, r in _FP.items()}
        out.append(Event("mismatch", rank=int(m.group("rank")), seq=int(fa["seq"] or -1),
                         op=norm_op(fa["op"]) if fa["op"] else "", **base,
                         detail={"shape": fa["shape"], "reporter": line.rank}))  # fmt: skip
    if len(prints) >= 2:
        fps = [
            (int(m.group("rank")), {k: (x.group(1) if (x := r.search(m.group("fp"))) else "")
                                    for k, r in _FP.items()})
            for m in prints
        ]  # fmt: skip
        (a, fa), others = fps[0], fps[1:]
        for b, fb in others:
            out.append(
                Event("mismatch", rank=a, peer=b, seq=int(fa["seq"] or -1),
                      op=norm_op(fa["op"]) if fa["op"] else "", **base,
                      detail={"peer_seq": int(fb["seq"] or -1),
                              "peer_op": norm_op(fb["op"]) if fb["op"] else "",
                              "shape": fa["shape"], "peer_shape": fb["shape"],
                              "dtype": fa["dtype"].strip(), "peer_dtype": fb["dtype"].strip(),
                              "reporter": line.rank})
            )  # fmt: skip
    return out
