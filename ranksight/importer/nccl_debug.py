"""``NCCL_DEBUG=INFO`` logs (with ``NCCL_DEBUG_SUBSYS`` including COLL): one line per
collective call::

    host:pid:tid [cudaDev] NCCL INFO AllReduce: opCount 1f sendbuff 0x.. recvbuff 0x..
      count 8192 datatype 7 op 0 root 0 comm 0x55d0a1b2c3d0 [nranks=4] stream 0x..

``opCount`` is hexadecimal and counts the calls on one communicator. Per rank and
communicator the calls become ``collectives`` rows (op, count, dtype; no completion is
logged, so ``end_ns`` is 0) and one ``progress`` row (highest opCount issued; completion
unknown: -1). Communicators are told apart by their order of first use on each rank
(``nccl_comm0``, ``nccl_comm1``...: the same on every rank when the job creates them in
one order) and their size. ``NCCL version``, ``Channel`` and transport (``via P2P/IPC``,
``NET/IB``) lines are kept as the rank's topology notes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .rows import Rows, group_id, norm_op

CALL = re.compile(
    r"NCCL INFO (?P<op>\w+): opCount (?P<count>[0-9a-fA-F]+) .*?count (?P<n>\d+) datatype (?P<dt>\d+)"
    r".*?comm (?P<comm>0x[0-9a-fA-F]+)(?: \[nranks=(?P<nranks>\d+)\])?"
)
INIT = re.compile(r"comm (?P<comm>0x[0-9a-fA-F]+) rank (?P<rank>\d+) nranks (?P<nranks>\d+)", re.I)
DEV = re.compile(r"\[(?P<dev>\d+)\] NCCL INFO")
DTYPES = {0: "int8", 1: "uint8", 2: "int32", 3: "uint32", 4: "int64", 5: "uint64",
          6: "float16", 7: "float32", 8: "float64", 9: "bfloat16"}  # fmt: skip
"""NCCL's ``ncclDataType_t`` numbers (nccl.h)."""
NOTES = ("NCCL version", "Channel", " via ", "NET/", "Trees", "Ring")
MARKER = "NCCL INFO"


@dataclass
class RankLog:
    """Calls and notes from one rank's log."""

    rank: int | None
    calls: dict[str, list[tuple[str, int, int, str]]] = field(default_factory=dict)
    """comm pointer -> [(op, opCount, count, dtype)], in log order."""
    nranks: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    device: str = ""


def read(path: str, rank: int | None) -> RankLog:
    """Parse one rank's log line by line (``rank`` from the file name; else from an init
    line ``comm 0x.. rank 3 nranks 8``)."""
    log = RankLog(rank)
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if MARKER not in line:
                continue
            m = CALL.search(line)
            if m:
                comm = m.group("comm")
                log.calls.setdefault(comm, []).append(
                    (norm_op(m.group("op")), int(m.group("count"), 16), int(m.group("n")),
                     DTYPES.get(int(m.group("dt")), m.group("dt")))
                )  # fmt: skip
                if m.group("nranks"):
                    log.nranks[comm] = int(m.group("nranks"))
                if not log.device and (d := DEV.search(line)):
                    log.device = f"cuda:{d.group('dev')}"
                continue
            i = INIT.search(line)
            if i:
                log.nranks[i.group("comm")] = int(i.group("nranks"))
                if log.rank is None:
                    log.rank = int(i.group("rank"))
            if any(n in line for n in NOTES) and len(log.notes) < 50:
                log.notes.append(line.split("NCCL INFO", 1)[1].strip())
    return log


def rows_of(logs: list[RankLog], ts_ns: int) -> Rows:
    """Rows of every rank's log: communicator k of every rank is one group whose members
    are the ranks that used a k-th communicator of that size."""
    out = Rows()
    comms: dict[tuple[int, int], list[int]] = {}
    for lg in logs:
        if lg.rank is None:
            continue
        for k, comm in enumerate(lg.calls):
            comms.setdefault((k, lg.nranks.get(comm, 0)), []).append(lg.rank)
    for lg in logs:
        if lg.rank is None:
            continue
        out.add("ranks", {"rank": lg.rank, "world_size": max((n for _, n in comms), default=0),
                          "device": lg.device, "dp": -1, "tp": -1, "pp": -1})  # fmt: skip
        for k, (comm, calls) in enumerate(lg.calls.items()):
            members = sorted(comms[(k, lg.nranks.get(comm, 0))])
            gid = group_id(f"nccl_comm{k}", members)
            text = ",".join(map(str, members))
            out.extend(
                "collectives",
                [
                    {"rank": lg.rank, "step": -1, "group_id": gid, "group_ranks": text,
                     "group_seq": seq, "op": op, "peer": -1, "dtype": dt, "numel_in": n,
                     "numel_out": n, "enqueue_ns": ts_ns, "start_ns": ts_ns, "end_ns": 0}
                    for op, seq, n, dt in calls
                ],
            )  # fmt: skip
            out.add(
                "progress",
                {"rank": lg.rank, "ts_ns": ts_ns, "step": -1, "group_id": gid, "group_ranks": text,
                 "direction": "", "peer": -1, "issued_seq": max(c[1] for c in calls),
                 "completed_seq": -1, "last_op": calls[-1][0], "last_issue_ns": 0},
            )  # fmt: skip
    return out
