"""What one log line says, as one ``log_events`` row: the vocabulary every line format
of :mod:`ranksight.importer.logs` writes and the analyzer's log reasoning
(``analyzer/log_evidence.py``) reads.

A line is read the way it is written: ``rank`` is the *global* rank only where the line
says it (torchrun's ``[rankN]:`` prefix, an MPI ``[1,N]<stderr>:`` tag, a rank list);
``group_rank`` is the rank a process group gives itself (``[PG 1 Rank 3]``, the bare
``[Rank 3]`` of ProcessGroupNCCL), which is the global rank only in the default group.
Unknown numbers are -1, unknown text "".
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from ranksight.store.fit import fit_int, fit_text
from ranksight.store.schema import table

KINDS = (
    "timeout",  # a watchdog or blocking-wait timeout of one work item (seq, op, numel)
    "status",  # a watchdog status line: failed at work seq, last enqueued / completed
    "watchdog_stuck",  # the heartbeat monitor: the watchdog thread itself is blocked
    "desync_report",  # TORCH_NCCL_DESYNC_DEBUG: rank finished #seq but did not join #seq+1
    "mismatch",  # TORCH_DISTRIBUTED_DEBUG=DETAIL: two ranks' collective fingerprints differ
    "child_failed",  # torchrun's ChildFailedError summary: one failed rank
    "nccl_calls",  # NCCL_DEBUG=INFO collective calls of one rank on one communicator
    "nccl_warn",  # an NCCL WARN line (transport, IB, CUDA failure, mismatch)
    "comm_abort",  # NCCL's "comm 0x.. rank R nranks N ... Abort COMPLETE": a comm torn down
    "nccl_error",  # "NCCL error in: ...": NCCL's result raised (op: system, remote, cuda...)
    "fr_missing",  # fr_trace / NCCL RAS: ranks that did not join a collective
    "gpu_error",  # ECC, XID, NVML Unknown Error, PCIe AER, CUDA device errors
    "exception",  # a rank's Python exception line (RuntimeError: ...), first of its kind
    "traceback",  # a rank began a Python traceback (its exception may be cut off)
    "fatal_signal",  # a process caught SIGSEGV / SIGBUS ... (UCX, faulthandler, the shell)
    "init_failure",  # the c10d store at start-up: workers missing, the master unreachable
    "peer_gone",  # gloo: the connection to a peer closed or reset (the peer went away)
    "worker_died",  # Ray's raylet: a worker process died (its pid and address)
    "world",  # a line that says how many ranks the job or a group has (``code``)
    "nodes",  # a line that says the job spans several nodes (``nnodes=2``: ``code``)
    "present",  # a rank that printed something (a heartbeat for "who left no line")
    "stack",  # a py-spy dump: the main thread's innermost frames and what they say
    "nccl_info",  # one process's NCCL version, topology and transport lines
)


_INTS = {name: t for name, t in table("log_events").columns if t[:3] in ("Int", "UIn")}
"""Each integer column's type (store/schema.py): a value past it is unknown (-1,
:func:`~ranksight.importer.rows.fit_int`)."""


@dataclass(slots=True)
class Event:
    """One observation from a log (see the module doc for ``rank`` vs ``group_rank``).

    ``seq``: a work sequence number of ``pg`` (counted inside that group only);
    ``enqueued``/``completed``: the watchdog's last enqueued / completed work of ``pg``;
    ``peer``: another rank the line names (a mismatch's other rank, a failure's root);
    ``code``: an exit code, XID, or a size (``world``); ``detail``: extra fields as JSON
    text; ``count``: how many identical lines this row stands for."""

    kind: str
    rank: int = -1
    local_rank: int = -1
    group_rank: int = -1
    host: str = ""
    pid: int = -1
    file: str = ""
    line: int = 0
    pg: str = ""
    pg_name: str = ""
    seq: int = -1
    op: str = ""
    numel_in: int = -1
    numel_out: int = -1
    enqueued: int = -1
    completed: int = -1
    peer: int = -1
    code: int = -1
    detail: dict = field(default_factory=dict)
    count: int = 1
    text: str = ""

    def key(self) -> tuple:
        """What makes two events the same observation (repeats are counted, not kept): a
        timeout told again (``terminated with exception``, ``what():``, the blocking-wait
        line) is the same timeout whatever else its line adds."""
        detail = (
            "" if self.kind == "timeout" else json.dumps(self.detail, sort_keys=True, default=str)
        )
        return (self.kind, self.rank, self.local_rank, self.group_rank, self.host, self.pid, self.pg,
                self.seq, self.op, self.numel_in, self.enqueued, self.completed, self.peer,
                self.code if self.kind != "timeout" else -1, detail)  # fmt: skip

    def row(self) -> dict:
        """The ``log_events`` row (``detail`` as JSON text, ``text`` cut to 400 chars)."""
        r = asdict(self)
        for k, kind in _INTS.items():  # past its column (NumelIn=2**64-1, [rank99999999999])
            if k in r:
                r[k] = fit_int(r[k], kind)
        r["detail"] = json.dumps(self.detail, sort_keys=True, default=str)
        r["text"] = fit_text(self.text[:400])
        return r


def dedupe(events: list[Event]) -> list[Event]:
    """``events`` with repeats folded into the first (``count`` summed), order kept."""
    out: dict[tuple, Event] = {}
    for e in events:
        k = e.key()
        if k in out:
            out[k].count += e.count
        else:
            out[k] = e
    return list(out.values())
