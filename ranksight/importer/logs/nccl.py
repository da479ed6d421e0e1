"""``NCCL_DEBUG=INFO`` / ``WARN`` lines, from one rank or many in one file.

Every NCCL line starts ``host:pid:tid [cudaDev] NCCL INFO|WARN`` (a process is told by
``host:pid``; posts splice two headers into one line, or cut the host short). Read:

- collective calls (``NCCL_DEBUG_SUBSYS=COLL``): ``AllReduce: opCount 1f ... count 8192
  datatype 7 ... comm 0x55d0a1b2c3d0 [nranks=4]``, counted per process and communicator
  into one ``nccl_calls`` event: ``seq`` the calls counted - 1 (some NCCL versions print
  ``opCount 0`` on every call, so calls are counted, never the number trusted),
  ``enqueued`` the highest opCount, ``detail`` calls per op. Communicators are named by
  their order of first use in the process and their size (``comm0:n8``): the same on
  every rank of a job that creates them in one order;
- init lines (``comm 0x.. rank 3 nranks 8 cudaDev 3 ... busId 3b000``): a process's rank
  in its largest communicator is taken as its global rank (a ``world`` event gives the
  size), and its GPU's bus id;
- ``ncclCommAbort``'s ``comm 0x.. rank 6 nranks 8 cudaDev 2 busId b000 - Abort COMPLETE``
  (the same fields): a ``comm_abort`` event, ``code`` the communicator's size. The
  process tore its communicator down: ProcessGroupNCCL does so when its watchdog caught
  an error or a timeout (and some torch versions at ``destroy_process_group``), so it is
  no failure by itself, but a rank that did it was not idle in a hang;
- an error's way out, ``init.cc:1929 -> 3`` (``file:line -> ncclResult_t``, non-zero:
  the call at that line failed with that result, 3 ``ncclInternalError``): the process's
  last one goes in its ``present`` event as ``detail.failed`` (``{"at", "code"}``), so that
  several processes failing one set-up are told from one rank's error (vllm#10453: pid
  412's ``graph/paths.cc:260 -> 3 ... init.cc:1929 -> 3``);
- whether a process printed only set-up lines (``cudaDriverVersion``, ``Bootstrap :
  Using``, plugins, channels, rings and trees, ``comm .. rank R nranks N`` init: see
  :data:`SETUP`), ``detail.setup_only`` of its ``present`` event: such lines say nothing
  of whether it reached a later collective (lightning#20434's rank 2); a service
  thread's ``Connection closed``, an abort, an error's way out or a call is no set-up;
- ``NCCL WARN`` lines as ``nccl_warn`` events, ``detail`` ``category``: ``ib_async``
  (``NET/IB : Got async event : port error``), ``ib_completion`` (``Got completion from
  peer ... with error``), ``net_mismatch``, ``mismatch`` (``Mismatched collective
  detected``, with ``at and around rank N`` as ``peer``), ``cuda_oom`` (``Cuda failure 'out
  of memory'``, ``Failed to CUDA calloc 6291456 bytes``: the GPU had no room for NCCL's
  buffers), ``cuda`` (another CUDA failure), ``remote_closed``
  (``Connection closed by remote peer``, ``Connection reset``, ``Broken pipe``: the
  other end went away; its address in ``detail.remote``), ``connect_failed``
  (``socketStartConnect: Connect to 10.0.0.82<38455> failed : Software caused connection
  abort``, sglang#5594: this process could not reach the peer at that address),
  ``proxy_call`` (a headless ``Proxy Call to rank 7 failed (Connect)``, vllm#798: the
  other rank's proxy could not be reached; that rank is ``peer``), ``ib_verbs``, ``other``;
- the devices of a process whose lines show more than one ``[N]`` (one process driving
  several GPUs: nccl#1283's pid 2657296 on devices 0 and 1), ``detail.devices`` of its
  ``present`` event: its device is then no rank.
"""

from __future__ import annotations

import re

from ..rows import norm_op
from .events import Event
from .lines import LogLine

_HEAD = re.compile(r"(?P<host>[\w.-]*):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>\d+)\] "
                   r"(?:[\w/.-]+:\d+ )?NCCL (?P<level>INFO|WARN|TRACE|ERROR)\s?")  # fmt: skip
_CALL = re.compile(
    r"^(?P<op>\w+): opCount (?P<count>[0-9a-fA-F]+) .*?count (?P<n>\d+) datatype (?P<dt>\d+)"
    r".*?comm (?P<comm>0x[0-9a-fA-F]+)(?: \[nranks=(?P<nranks>\d+)\])?"
)
_INIT = re.compile(r"comm (?P<comm>0x[0-9a-fA-F]+) rank (?P<rank>\d+) nranks (?P<nranks>\d+)"
                   r"(?: cudaDev (?P<dev>\d+))?(?:.*?busId (?P<bus>[0-9a-fA-F]+))?", re.I)  # fmt: skip
_RETURN = re.compile(r"^(?P<at>[\w/.-]+\.(?:cc|cpp|h|c):\d+) -> (?P<code>[1-9]\d*)\b")
_NET_RETURN = re.compile(r"^transport/net[\w]*\.cc:\d+ -> |\[Proxy Thread\]")
"""An error way out through NCCL's network transport (``transport/net.cc``,
``transport/net_ib.cc``) or its proxy thread: not the socket helpers (``misc/socket.cc``),
which also fail at a clean tear-down (Fuser#3055)."""
NET_CODES = (2, 6)
"""``ncclSystemError`` and ``ncclRemoteError``: the codes of a network failure."""
SETUP = re.compile(
    r"cudaDriverVersion|Bootstrap|NCCL version|Plugin|NET/\w+ : Using|Using network|Channel|"
    r"Trees|Ring|\bvia\b|coll channels|threadThresholds|Chunksize|Launch mode|Setting "
    r"affinity|ncclCommInitRank|ncclCommSplit|Init COMPLETE|Connected all|CC Off|NCCL_\w+ set|"
    r"comm 0x[0-9a-fA-F]+ rank \d+ nranks \d+(?!.*Abort)|nvmlDev|MNNVL|NVLS multicast|PXN"
)
"""Words of NCCL's INFO lines printed while a communicator is made, before any collective
(the lines of NCCL 2.18-2.21 set-up in the corpus: lightning#20434, Open-Sora-Plan#386)."""
_REMOTE = re.compile(r"(?:from|peer|to)\s+(?P<addr>[\w.:%\[\]-]+?)<\d+>")
_AROUND = re.compile(r"at and around rank (?P<r>\d+)")
_WARN_KINDS = (
    ("launch", ("Duplicate GPU detected", "has already checked in")),
    ("no_interface", ("no socket interface found",)),
    ("ib_async", ("Got async event",)),
    ("ib_completion", ("Got completion from peer", "completion with error")),
    ("net_mismatch", ("collective mismatch error",)),
    ("mismatch", ("Mismatched collective",)),
    ("cuda_oom", ("Cuda failure 'out of memory'", "Failed to CUDA calloc",
                  "Failed to CUDA malloc", "cudaErrorMemoryAllocation")),
    ("cuda", ("Cuda failure", "CUDA failure", "cudaError")),
    ("remote_closed", ("closed by remote peer", "Connection reset", "Broken pipe",
                       "Connection refused", "remote process exited")),
    ("connect_failed", ("socketStartConnect", "socketConnect", "Connect to ")),
    ("ib_verbs", ("ibv_", "NET/IB")),
    ("net", ("NET/OFI", "NET/Socket", "NET/")),
)  # fmt: skip
LAUNCH = ("launch", "no_interface")
"""``nccl_warn`` categories of NCCL refusing a job's set-up (a GPU or a rank given twice, no
network interface to use): read also where only a ``Last error:`` line says them."""
MARKERS = ("NCCL INFO", "NCCL WARN", "NCCL TRACE", "NCCL ERROR", "NCCL error", "NET/", "nccl",
           "Last error", "Proxy Call to rank",
           *(w for cat, words in _WARN_KINDS if cat in LAUNCH for w in words))  # fmt: skip
_PROXY = re.compile(r"Proxy Call to rank (?P<r>\d+) failed \((?P<what>\w+)\)")
"""NCCL's ``Last error:`` of a call to another rank's proxy thread that failed (vllm#798:
``Proxy Call to rank 7 failed (Connect)``)."""
_NCCL_ERROR = re.compile(r"NCCL error(?: in: \S+)?[,:]?\s*(?P<reason>unhandled system error|"
                         r"unhandled cuda error|internal error|invalid usage|invalid argument|"
                         r"remote process exited or there was a network error|"
                         r"[^,]*?)(?:,|\s+NCCL version|$)")  # fmt: skip
_ANYWHERE = re.compile(r"(?P<msg>NET/IB : Got (?:completion from peer|async event)[^\n]*|"
                       r"NET/OFI [^\n]*completed with error[^\n]*|"
                       r"NET/\w+ : [^\n]*(?:failed|error)[^\n]*)")  # fmt: skip
_ERROR_WORDS = ("ncclRemoteError", "ncclSystemError", "ncclInternalError")
"""ncclResult_t names that make a line an ``nccl_error`` without the words ``NCCL error``
(vllm#798: ``ncclInternalError: Internal check failed.``)."""
BENIGN = ("Failed to open libibverbs", "No plugin found", "Could not find", "NET/Plugin",
          "Using network Socket", "ibv_fork_init", "Unable to find", "falling back",
          "recv_close with outstanding requests")  # fmt: skip
"""WARN lines of a library NCCL falls back from, and of a communicator being aborted
(aws-ofi-nccl's ``NET/OFI Attempt to call recv_close with outstanding requests!`` as its
requests are dropped, aws-k8s-tester#524): no failure of their own."""
ERROR_KINDS = (
    ("system", ("unhandled system error", "ncclSystemError")),
    ("remote", ("remote process exited", "ncclRemoteError")),
    ("cuda", ("unhandled cuda error", "ncclUnhandledCudaError")),
    ("usage", ("invalid usage", "invalid argument", "ncclInvalidUsage", "ncclInvalidArgument")),
    ("internal", ("internal error", "ncclInternalError")),
)
"""An NCCL error's class (nccl.h's ncclResult_t) from its words."""


_NET_CHANNEL = re.compile(
    r"Channel \d+/\d+ : (?P<a>\d+)\[(?P<da>\d+)\] -> (?P<b>\d+)\[(?P<db>\d+)\]"
    r"(?: \[(?:send|receive)\])? via (?P<net>NET/[\w.-]+)"
)
"""A ring or tree channel to a peer over the network (``Channel 07/0 : 15[7] -> 7[7]
[receive] via NET/IBext_v8/7/GDRDMA``, sglang#3836): the two communicator ranks sit on
different nodes (P2P, SHM and NVLS stay inside one)."""


def _across_nodes(proc: tuple, m: re.Match) -> Event:
    """A ``nodes`` event for a process with a channel over the network: the job spans
    more than one node (``code`` 2, a lower bound), and its communicator ranks
    (``detail.comm_ranks``) exist, so the world is larger than the higher of them."""
    a, b = int(m.group("a")), int(m.group("b"))
    return Event("nodes", host=proc[0], pid=proc[1], code=2, text=m.group(0),
                 detail={"source": "nccl_channel", "comm_ranks": sorted({a, b}),
                         "transport": m.group("net")})  # fmt: skip


def error_class(text: str) -> str:
    """The class of an ``NCCL error ...`` line (see :data:`ERROR_KINDS`), or ``other``."""
    for cls, words in ERROR_KINDS:
        if any(w in text for w in words):
            return cls
    return "other"


NOTES = ("NCCL version", "Channel", " via ", "NET/", "Trees", "Ring")
"""Words of the INFO lines kept as a process's topology notes (``nccl_info`` events)."""
MAX_NOTES = 10
MAX_AT = 64
"""Last calls kept per communicator as opCount -> op (a desync shows in the last ones)."""


def warn_category(msg: str) -> str:
    """The ``nccl_warn`` category of a WARN line's message (see the module doc)."""
    for cat, words in _WARN_KINDS:
        if any(w in msg for w in words):
            return cat
    return "other"


class Reader:
    """Per-process NCCL state of one file; :meth:`finish` gives its events."""

    name = "nccl"
    markers = MARKERS

    def __init__(self) -> None:
        self.calls: dict[tuple, dict] = {}  # (proc, comm) -> {ops, n, top, last, nranks}
        self.order: dict[tuple, list[str]] = {}  # proc -> comms in order of first use
        self.init: dict[tuple, dict[str, tuple[int, int, str]]] = {}  # proc -> comm -> (r, n, bus)
        self.proc_rank: dict[tuple, int] = {}
        self.notes: dict[tuple, list[str]] = {}
        self.dev: dict[tuple, int] = {}  # proc -> its CUDA device (NCCL's [cudaDev])
        self.devs: dict[tuple, set[int]] = {}  # proc -> every device its lines show
        self.failed: dict[tuple, dict] = {}  # proc -> its last "file:line -> code"
        self.past_setup: set[tuple] = set()  # procs with a line that is no set-up line
        self.net_failed: set[tuple] = set()  # (proc, device) with a network error way out
        self.net: dict[tuple, re.Match] = {}  # proc -> its first channel over the network
        self.out: list[Event] = []

    def feed(self, line: LogLine) -> None:
        """Read one NCCL line (the last header on a spliced line wins)."""
        heads = list(_HEAD.finditer(line.text))
        if not heads:
            self._headless(line)
            return
        h = heads[-1]
        msg = line.text[h.end() :]
        proc = (line.host or h.group("host"), int(h.group("pid")))
        self.dev.setdefault(proc, int(h.group("dev")))
        self.devs.setdefault(proc, set()).add(int(h.group("dev")))
        if line.rank >= 0:
            self.proc_rank.setdefault(proc, line.rank)
        if h.group("level") != "INFO" or not SETUP.search(msg):
            self.past_setup.add(proc)
        if h.group("level") in ("WARN", "ERROR"):
            self._warn(proc, h, msg, line)
        elif m := _RETURN.match(msg):
            self.failed[proc] = {"at": m.group("at"), "code": int(m.group("code"))}
            if _NET_RETURN.search(msg) and int(m.group("code")) in NET_CODES:
                self._net_return(proc, int(h.group("dev")), msg, line)
        elif m := _CALL.match(msg):
            self._call(proc, m)
            self.calls[(proc, m.group("comm"))]["dev"] = int(h.group("dev"))
        elif m := _INIT.search(msg):
            self.init.setdefault(proc, {})[m.group("comm")] = (
                int(m.group("rank")),
                int(m.group("nranks")),
                (m.group("bus") or "").lower(),
            )
            if "Abort COMPLETE" in msg:
                self._abort(proc, m, line)
        elif any(n in msg for n in NOTES):
            if (net := _NET_CHANNEL.search(msg)) and proc not in self.net:
                self.net[proc] = net
            notes = self.notes.setdefault(proc, [])
            if len(notes) < MAX_NOTES:
                notes.append(msg.strip())

    def _call(self, proc: tuple, m: re.Match) -> None:
        comm = m.group("comm")
        order = self.order.setdefault(proc, [])
        if comm not in order:
            order.append(comm)
        c = self.calls.setdefault((proc, comm), {"ops": {}, "n": 0, "top": -1, "last": "",
                                                 "nranks": 0})  # fmt: skip
        op = norm_op(m.group("op"))
        c["ops"][op] = c["ops"].get(op, 0) + 1
        c["n"] += 1
        c["top"] = max(c["top"], int(m.group("count"), 16))
        c["last"] = op
        c.setdefault("at", {})[int(m.group("count"), 16)] = op
        if len(c["at"]) > MAX_AT:
            c["at"].pop(next(iter(c["at"])))
        if m.group("nranks"):
            c["nranks"] = int(m.group("nranks"))

    def _net_return(self, proc: tuple, dev: int, msg: str, line: LogLine) -> None:
        """One ``nccl_warn`` of category ``net`` per process and device whose error way
        out runs through NCCL's network transport or its proxy thread (nccl#629: host
        A03-R28-I49-2's ``transport/net.cc:389 -> 2``, ``proxy.cc:452 -> 2 [Proxy Thread]``
        on device 0, before its peer saw the connection reset): a failure in the network
        path of that process, whose own WARN is outside the lines. A process's device with a
        WARN of its own keeps only that (:meth:`finish`): its error way out adds nothing to it
        (nccl#795: 'Call to recv ... failed : Broken pipe', then ``transport/net.cc:517 ->
        6``)."""
        if (proc, dev) in self.net_failed:
            return
        self.net_failed.add((proc, dev))
        self.out.append(Event("nccl_warn", rank=line.rank, local_rank=dev, host=proc[0],
                              pid=proc[1], line=line.number, text=msg.strip(),
                              detail={"category": "net", "device": f"cuda:{dev}",
                                      "return": True}))  # fmt: skip

    def _abort(self, proc: tuple, m: re.Match, line: LogLine) -> None:
        """A ``comm_abort`` of the process (its rank in that communicator as ``group_rank``;
        the global rank is filled in :meth:`finish`, as for warnings)."""
        dev = int(m.group("dev")) if m.group("dev") else self.dev.get(proc, -1)
        self.out.append(Event("comm_abort", rank=line.rank, local_rank=dev,
                              group_rank=int(m.group("rank")), host=proc[0], pid=proc[1],
                              line=line.number, code=int(m.group("nranks")), text=m.group(0),
                              detail={"source": "nccl", "comm": m.group("comm")}))  # fmt: skip

    def _headless(self, line: LogLine) -> None:
        """NCCL's words in a line of someone else's (an exception's message, a traceback's
        ``Last error:``, one flattened post): an ``nccl_error`` or an ``nccl_warn``."""
        t = line.text
        if p := _PROXY.search(t):
            self.out.append(Event("nccl_warn", rank=line.rank, local_rank=line.local_rank,
                                  host=line.host, line=line.number, peer=int(p.group("r")),
                                  text=p.group(0),
                                  detail={"category": "proxy_call", "call": p.group("what")}))  # fmt: skip
        if (cat := warn_category(t)) in LAUNCH:  # a 'Last error:' naming a launch error
            self.out.append(Event("nccl_warn", rank=line.rank, local_rank=line.local_rank,
                                  host=line.host, line=line.number, text=t.strip(),
                                  detail={"category": cat}))  # fmt: skip
        if (m := _NCCL_ERROR.search(t)) or any(w in t for w in _ERROR_WORDS):
            reason = m.group("reason").strip() if m else ""
            self.out.append(Event("nccl_error", rank=line.rank, local_rank=line.local_rank,
                                  host=line.host, line=line.number, op=error_class(t),
                                  text=t, detail={"reason": reason[:120]}))  # fmt: skip
        if m := _ANYWHERE.search(t):
            msg = m.group("msg")
            detail: dict = {"category": warn_category(msg)}
            if r := _REMOTE.search(msg):
                detail["remote"] = r.group("addr")
            self.out.append(Event("nccl_warn", rank=line.rank, local_rank=line.local_rank,
                                  host=line.host, line=line.number, detail=detail,
                                  text=msg.strip()))  # fmt: skip

    def _warn(self, proc: tuple, h: re.Match, msg: str, line: LogLine) -> None:
        cat = warn_category(msg) if not any(b in msg for b in BENIGN) else "benign"
        detail: dict = {"category": cat, "device": f"cuda:{h.group('dev')}"}
        if r := _REMOTE.search(msg):
            detail["remote"] = r.group("addr")
        peer = int(a.group("r")) if (a := _AROUND.search(msg)) else -1
        self.out.append(Event("nccl_warn", rank=line.rank, local_rank=int(h.group("dev")),
                              host=proc[0], pid=proc[1],
                              line=line.number, peer=peer, detail=detail, text=msg.strip()))  # fmt: skip

    def _rank_of(self, proc: tuple) -> tuple[int, int, str]:
        """(global rank, world size, bus id) of a process from its largest communicator."""
        comms = self.init.get(proc, {})
        if not comms:
            return self.proc_rank.get(proc, -1), 0, ""
        r, n, bus = max(comms.values(), key=lambda v: v[1])
        return self.proc_rank.get(proc, r), n, bus

    def finish(self) -> list[Event]:
        """``nccl_calls``, ``world`` and ``nccl_warn`` events of the file."""
        out = []
        procs = set(self.order) | set(self.init) | set(self.notes) | set(self.dev)
        procs |= {(e.host, e.pid) for e in self.out}
        for proc in sorted(procs):
            rank, world, bus = self._rank_of(proc)
            if rank >= 0 or proc in self.dev:
                detail: dict = {"source": "nccl"}
                if proc in self.failed:
                    detail["failed"] = self.failed[proc]
                if proc not in self.past_setup:
                    detail["setup_only"] = True
                if len(devs := self.devs.get(proc, set())) > 1:
                    detail["devices"] = sorted(devs)
                out.append(Event("present", rank=rank, local_rank=self.dev.get(proc, -1),
                                 host=proc[0], pid=proc[1], detail=detail))  # fmt: skip
            if self.notes.get(proc):
                out.append(Event("nccl_info", rank=rank, host=proc[0], pid=proc[1],
                                 detail={"notes": self.notes[proc]}))  # fmt: skip
            if world:
                out.append(Event("world", rank=rank, host=proc[0], pid=proc[1], code=world,
                                 detail={"source": "nccl_nranks", "bus": bus}))  # fmt: skip
            for k, comm in enumerate(self.order.get(proc, [])):
                c = self.calls[(proc, comm)]
                n = c["nranks"] or self.init.get(proc, {}).get(comm, (0, 0, ""))[1]
                out.append(Event("nccl_calls", rank=rank, host=proc[0], pid=proc[1],
                                 pg=f"comm{k}:n{n}", seq=c["n"] - 1, enqueued=c["top"],
                                 op=c["last"], local_rank=int(c.get("dev", -1)),
                                 detail={"ops": c["ops"], "comm": comm,
                                         "at": {str(k): v for k, v in c.get("at", {}).items()}}))  # fmt: skip
        warned = {(e.host, e.pid, e.local_rank) for e in self.out
                  if e.kind == "nccl_warn" and not e.detail.get("return")}  # fmt: skip
        self.out = [e for e in self.out
                    if not (e.detail.get("return") and (e.host, e.pid, e.local_rank) in warned)]  # fmt: skip
        for proc, m in sorted(self.net.items()):
            out.append(_across_nodes(proc, m))
        for e in self.out:
            if e.rank < 0 and e.pid >= 0:
                e.rank = self._rank_of((e.host, e.pid))[0]
        return out + self.out
