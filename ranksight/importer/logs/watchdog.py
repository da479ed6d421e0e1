"""NCCL watchdog and blocking-wait timeouts, every torch version's wording.

========================  =====================================================
torch                     the line (after its ``[rankN]:[E... file:line]`` prefix)
========================  =====================================================
< 1.10                    ``[Rank 3] Watchdog caught collective operation timeout:
                          WorkNCCL(OpType=ALLREDUCE, TensorShape=[..], Timeout(ms)=..)``
1.10 - 2.1                ``[Rank 3] Watchdog caught ... WorkNCCL(SeqNum=904,
                          OpType=ALLREDUCE, Timeout(ms)=1800000) ran for .. milliseconds``
2.2 - 2.4                 the same with ``NumelIn``/``NumelOut``; then ``[PG 1 Rank 3]``
                          (or ``[PG 0 (default_pg) Rank 3]``) ``Exception (either an error
                          or timeout) detected by watchdog at work: 904, last enqueued NCCL
                          work: 905, last completed NCCL work: 903.``
2.5 +                     ``[PG ID 0 PG GUID 0(default_pg) Rank 3]`` on the lines
2.7 +                     ``failure detected by watchdog at work sequence id: 904 PG
                          status: last enqueued work: 904, last completed work: 903``
any (blocking wait)       ``Work WorkNCCL(SeqNum=904, ...) timed out in blocking wait``
========================  =====================================================

A timeout line becomes a ``timeout`` event (one cut before its ``WorkNCCL(...)`` or
inside it too, even inside the word ``collective``, with no op: FunASR#2006's
``[Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1573``), a status line a ``status`` event (``seq`` the failed work,
``enqueued``/``completed``), the heartbeat monitor's ``watchdog got stuck for 480
seconds`` a ``watchdog_stuck`` event (the watchdog thread itself blocked in a CUDA or
NCCL call: ``code`` the seconds). ``[Rank N]`` is the rank inside the group;
the global rank is the line's ``[rankN]:`` prefix, or ``N`` itself in the default group.
A watchdog that waited for the Flight Recorder's dump (``timed out after waiting for
60000ms flight recorder dumps to finish``) is a ``timeout`` of its op unknown, ``detail``
``fr_wait``. The same timeout told again (``terminated with exception: ...``, the blocking-wait line,
``what():``) is the same event, counted (:func:`events.dedupe`).
"""

from __future__ import annotations

import re
from typing import Any

from ..rows import norm_op
from .events import Event
from .lines import LogLine

MARKERS = ("WorkNCCL(", "last enqueued", "timed out in blocking wait", "NCCL work:",
           "Watchdog caught", "watchdog got stuck", "Heartbeat monitor timed out",
           "terminated with exception", "flight recorder dumps")  # fmt: skip
_CUT_EXC = re.compile(r"watchdog thread terminated with exception: \[Rank \d+\] Watchdog\s*$")
"""The watchdog's exception line cut right after ``[Rank N] Watchdog`` (LlamaFactory#8261:
``... [PG ID 1 PG GUID 1 Rank 4] Process group watchdog thread terminated with exception:
[Rank 4] Watchdog``): in ProcessGroupNCCL only the timeout's message begins so
(``[Rank N] Watchdog caught collective operation timeout``)."""
_FR_WAIT = re.compile(r"timed out after waiting for \d+ ?ms flight recorder dumps to finish")
"""ProcessGroupNCCL's watchdog after it found a work failed or timed out, waiting for the
Flight Recorder's dump before it takes the process down (LlamaFactory#8261's rank 3:
``[PG ID 1 PG GUID 1 Rank 3] timed out after waiting for 60000ms flight recorder dumps to
finish``): a rank that was waiting, its work and op not said."""
_STUCK = re.compile(r"watchdog got stuck for (?P<s>\d+) seconds|Heartbeat monitor timed out")
_QUEUED = re.compile(r"workMetaList_\.size\(\)\s*=\s*(\d+)")
"""The heartbeat monitor's count of the works the watchdog still tracks: enqueued and not
completed (``Heartbeat monitor timed out! ... workMetaList_.size()=103``)."""
_PG_NEW = re.compile(
    r"\[PG ID (?P<id>\d+) PG GUID ?(?P<guid>[^\s(\]]*)(?:\((?P<name>[^)]*)\))? Rank (?P<r>\d+)\]"
)
"""``[PG ID 2 PG GUID 9 Rank 4]``; the GUID may be empty (``[PG ID 0 PG GUID  Rank 3]``,
Fuser#3055, torch 2.5 under mpirun): the group is then known by its ID."""
_PG_OLD = re.compile(r"\[PG (?P<uid>[^\s(\]]+)(?: \((?P<name>[^)]*)\))? Rank (?P<r>\d+)\]")
_RANK = re.compile(r"\[Rank (?P<r>\d+)\]")
_FIELD = {  # a value cut at the line's end is unknown (SeqNum=1573 of 15734: FunASR#2006)
    "seq": re.compile(r"SeqNum=\s*(\d+)(?=[,)\s])"),
    "op": re.compile(r"OpType=\s*(\w+)(?=[,)\s])"),
    "nin": re.compile(r"NumelIn=\s*(-?\d+)(?=[,)\s])"),
    "nout": re.compile(r"NumelOut=\s*(-?\d+)(?=[,)\s])"),
    "timeout": re.compile(r"Timeout\(ms\)=\s*(\d+)(?=[,)\s])"),
}
_CAUGHT = re.compile(r"Watchdog caught (?P<word>c\w*)(?P<end>\s*$)?")


def _caught(text: str) -> bool:
    """Whether ``text`` holds ``Watchdog caught collective operation timeout``, also cut at
    the line's end inside the word ``collective`` (UniWorld#46: ``... [Rank 6] Watchdog
    caught co``): no other message of ProcessGroupNCCL's watchdog begins so."""
    m = _CAUGHT.search(text)
    if not m:
        return False
    word = m.group("word")
    return word == "collective" or (m.group("end") is not None and "collective".startswith(word))


_RAN = re.compile(r"ran for\s*(\d+)\s*milli", re.I)
_STATUS = re.compile(
    r"(?:at (?:NCCL )?work(?: sequence id)?:\s*(?P<seq>-?\d+)\D{0,40}?)?"
    r"last enqueued (?:NCCL )?work:\s*(?P<enq>-?\d+),?\s*last completed (?:NCCL )?work:\s*"
    r"(?P<done>-?\d+)"
)
_AT_WORK = re.compile(r"at (?:NCCL )?work(?: sequence id)?:\s*(?P<seq>-?\d+)")
DEFAULT_PG = ("0", "default_pg")


def group_of(text: str) -> tuple[str, str, int]:
    """(pg uid, pg name, rank in the group) from the line's bracket, "" / -1 if none."""
    if m := _PG_NEW.search(text):
        return m.group("guid") or m.group("id"), m.group("name") or "", int(m.group("r"))
    if m := _PG_OLD.search(text):
        return m.group("uid"), m.group("name") or "", int(m.group("r"))
    if m := _RANK.search(text):
        return "", "", int(m.group("r"))
    return "", "", -1


def global_rank(line: LogLine, pg: str, name: str, group_rank: int) -> int:
    """The line's global rank: its launcher prefix's, else the rank inside the default
    group (``[PG ID 0 PG GUID 0(default_pg) Rank 2]``: there the group rank is the global
    rank), else -1."""
    if line.rank >= 0:
        return line.rank
    return group_rank if (pg in DEFAULT_PG or name == "default_pg") and pg else -1


def parse(line: LogLine) -> list[Event]:
    """The ``timeout`` / ``status`` events of one logical line (none if it is neither)."""
    text = line.text
    pg, name, grank = group_of(text)
    base: dict[str, Any] = dict(rank=global_rank(line, pg, name, grank), local_rank=line.local_rank,
                group_rank=grank, host=line.host, line=line.number, pg=pg, pg_name=name,
                text=text)  # fmt: skip
    out = []
    at = text.find("WorkNCCL(")
    timed_out = re.search(r"timeout|timed out|timing out", text, re.I)
    if at >= 0 and timed_out:
        work = text[at : at + 400]
        f = {k: (m.group(1) if (m := r.search(work)) else None) for k, r in _FIELD.items()}
        if f["op"]:
            ran = _RAN.search(text)
            out.append(
                Event("timeout", **base, seq=int(f["seq"]) if f["seq"] else -1,
                      op=norm_op(f["op"]), numel_in=int(f["nin"] or -1),
                      numel_out=int(f["nout"] or -1), code=int(f["timeout"] or -1),
                      detail={"ran_ms": int(ran.group(1))} if ran else {})
            )  # fmt: skip
        elif _caught(text):  # cut inside WorkNCCL(...): a timeout, its op unknown
            out.append(Event("timeout", **base, seq=int(f["seq"]) if f["seq"] else -1,
                             detail={"cut": True}))  # fmt: skip
    elif _caught(text) or _CUT_EXC.search(text):  # the line is cut before its WorkNCCL(...)
        out.append(Event("timeout", **base, detail={"cut": True}))
    elif _FR_WAIT.search(text):  # its watchdog found a work failed or timed out
        out.append(Event("timeout", **base, detail={"cut": True, "fr_wait": True}))
    if m := _STUCK.search(text):
        queued = _QUEUED.search(text)
        out.append(Event("watchdog_stuck", **base, code=int(m.group("s") or -1),
                         detail={"queued": int(queued.group(1))} if queued else {}))  # fmt: skip
    if s := _STATUS.search(text):
        seq = s.group("seq") or (m.group("seq") if (m := _AT_WORK.search(text)) else None)
        out.append(
            Event("status", **base, seq=int(seq) if seq is not None else -1,
                  enqueued=int(s.group("enq")), completed=int(s.group("done")))
        )  # fmt: skip
    return out
