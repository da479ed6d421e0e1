"""One view of an imported job's ``log_events`` that every log detector reads: who was
there, how big the job is, and how sure that is.

World size is taken from what the lines say (``world_size=8``, NCCL's ``nranks``,
``fr_trace``'s expected ranks, torchrun's failed ranks), never from the number of files;
where nothing says it, the highest rank seen or named in another rank's message + 1 is a
lower bound (``world_exact`` False) and ranks above it are unknown, not missing.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ranksight.ground.vocab import cause_of, kind_of
from ranksight.ground.words import span

from ..findings import NO_COORDS, Finding, coords_at

NAMED = ("timeout", "status", "present", "exception", "nccl_calls", "stack", "child_failed",
         "gpu_error", "mismatch", "nccl_warn", "nccl_info", "fatal_signal", "watchdog_stuck")  # fmt: skip
"""Event kinds whose ``rank`` is a rank that left a line of its own."""


@dataclass
class Evidence:
    """The events (``frame``: ``log_events`` rows with ``detail`` parsed into dicts),
    ranks that left a line (``present``), and the world size with its source."""

    frame: pd.DataFrame
    present: set[int] = field(default_factory=set)
    world: int = 0
    world_exact: bool = False
    world_source: str = ""
    assumed: str = ""
    """How ranks were mapped that the lines do not map themselves (a note), or ""."""
    bound: str = "the highest rank the lines name"
    """Where a lower bound of the world size (``world_exact`` False) comes from."""

    def of(self, *kinds: str) -> pd.DataFrame:
        """The events of ``kinds``."""
        return self.frame[self.frame["kind"].isin(kinds)]

    def mapped_only(self) -> set[int]:
        """Ranks known only from lines whose global rank was inferred (a group's
        ``[Rank N]`` with no group named, a local rank on one node), never stated."""
        f = self.frame[self.frame["rank"] >= 0]
        stated = set(f.loc[~f["mapped"].astype(bool), "rank"].astype(int))
        return set(f["rank"].astype(int)) - stated

    def where(self, frame: pd.DataFrame, test) -> pd.DataFrame:
        """The rows of ``frame`` whose parsed ``detail`` passes ``test(detail)``."""
        return keep(frame, [bool(test(d)) for d in frame["detail"]])

    def missing(self) -> list[int]:
        """Ranks of the world that left no line at all (below the lower bound only, where
        the world size is not said)."""
        if not self.world or self.world > 100_000:
            return []
        return sorted(set(range(self.world)) - self.present)

    def world_note(self) -> str:
        """How the world size is known, as a sentence for a finding's text."""
        if not self.world:
            return "The lines do not say the world size."
        if self.world_exact:
            return f"World size {self.world}, from {self.world_source}."
        return (
            f"World size at least {self.world}, {self.bound}: ranks above "
            f"{self.world - 1} may exist and be silent too."
        )


def keep(frame: pd.DataFrame, mask: list[bool]) -> pd.DataFrame:
    """The rows of ``frame`` where ``mask`` (one bool per row) holds; an empty frame keeps
    its columns (``frame[[]]`` would select no columns instead)."""
    return frame[np.asarray(mask, dtype=bool)] if len(frame) else frame


DEFAULT_PG = ("0", "default_pg")
"""How the default process group is named: uid 0, description ``default_pg``."""


def _with_groups(frame: pd.DataFrame) -> pd.DataFrame:
    """A timeout line that names no group takes the group of its rank's status line for
    the same work (torch 2.2-2.4 print them as two lines), else the one named group any
    rank is at with that sequence number; in the default group the rank inside it is the
    global rank. (Vectorized: a hang of thousands of ranks has as many lines.)"""
    st = frame[(frame["kind"] == "status") & (frame["pg"] != "")]
    pg_of = {(int(r), int(g), int(q)): p for r, g, q, p in
             zip(st["rank"], st["group_rank"], st["seq"], st["pg"], strict=True)}  # fmt: skip
    name_of = dict(zip(st["pg"], st["pg_name"], strict=True))
    todo = (frame["kind"] == "timeout") & (frame["pg"] == "")
    if todo.any():
        keys = zip(frame.loc[todo, "rank"], frame.loc[todo, "group_rank"], frame.loc[todo, "seq"],
                   strict=True)  # fmt: skip
        frame.loc[todo, "pg"] = [pg_of.get((int(r), int(g), int(q)), "") for r, g, q in keys]
    named = frame[frame["kind"].isin(("timeout", "status")) & (frame["pg"] != "")]
    at_seq = named.groupby("seq")["pg"].agg(lambda v: set(v)).to_dict()
    todo = (frame["kind"] == "timeout") & (frame["pg"] == "") & (frame["seq"] >= 0)
    if todo.any():  # the one group at that sequence number
        only = [next(iter(g)) if len(g := at_seq.get(int(q), set())) == 1 else ""
                for q in frame.loc[todo, "seq"]]  # fmt: skip
        frame.loc[todo, "pg"] = only
    filled = (frame["kind"] == "timeout") & (frame["pg_name"] == "") & (frame["pg"] != "")
    frame.loc[filled, "pg_name"] = [name_of.get(p, "") for p in frame.loc[filled, "pg"]]
    default = frame["pg"].isin(DEFAULT_PG) | (frame["pg_name"] == "default_pg")
    fill = default & (frame["rank"] < 0) & (frame["group_rank"] >= 0)
    frame.loc[fill, "rank"] = frame.loc[fill, "group_rank"]
    return frame


CLOSE_SEQS = 8
"""Timeouts of one op whose sequence numbers are this close are taken as one group's."""


def _unnamed(frame: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """Lines that name neither their group nor a global rank (torch < 2.2 with no
    launcher prefix): their ``[Rank N]`` is taken as the global rank when their timeouts
    are all at one sequence number (one group: most likely the default one; the ops may
    differ there, which is a desync)."""
    anon = (frame["rank"] < 0) & (frame["group_rank"] >= 0) & (frame["pg"] == "")
    if not anon.any():
        return frame, ""
    t = frame[anon & (frame["kind"] == "timeout")]
    seqs = {int(q) for q in t["seq"] if int(q) >= 0}
    close = seqs and max(seqs) - min(seqs) <= CLOSE_SEQS and len(set(t["op"]) - {""}) <= 1
    if len(seqs) > 1 and not close:  # several sequence numbers: several groups, maybe
        return frame, (
            "timeouts at several sequence numbers name neither their process group nor the "
            "global rank: their [Rank N] cannot be mapped to global ranks"
        )
    frame.loc[anon, "rank"] = frame.loc[anon, "group_rank"]
    frame.loc[anon, "mapped"] = True
    return frame, (
        "the lines name no process group and no launcher rank: their [Rank N] is taken as "
        "the global rank (every timeout is at one sequence number, or one op a few apart)"
    )


def _same_process(frame: pd.DataFrame) -> pd.DataFrame:
    """Events of one process (``host``, ``pid``) share what any of them says of its rank
    and local rank (a crash handler's line names the pid; NCCL's lines of that pid its
    device and rank), where that is one value."""
    procs = frame["pid"] >= 0
    if not procs.any():
        return frame
    key = frame["host"].astype(str) + ":" + frame["pid"].astype(str)
    for col in ("rank", "local_rank"):
        known = frame[procs & (frame[col] >= 0)].groupby(key[procs & (frame[col] >= 0)])[col]
        one = known.nunique()
        value = known.first()[one == 1]
        fill = procs & (frame[col] < 0) & key.isin(value.index)
        if fill.any():
            frame.loc[fill, col] = key[fill].map(value).to_numpy(dtype=frame[col].dtype)
    return frame


NODE_NAME = re.compile(r"(?:^|[-_.])(?:w|worker|node)[-_]?\d+$", re.I)
"""A host named as one node of several: ``...-train-lxc0-w-0`` (FunASR#2006),
``kp-ddp-worker-0`` (nccl#1405), ``rdma-test-gpu-worker-1`` (nccl#1029)."""


def several_nodes(frame: pd.DataFrame) -> str:
    """Why the lines may be one node's of a job of several ("" where nothing says so): more
    than one host, a host named as one node of several (:data:`NODE_NAME`), a ``nodes``
    event (``nnodes=2``), an NCCL network warning naming a peer address other than the
    host (:func:`_reached`), pdsh's host prefix (a ``traceback`` or DeepSpeed launcher event
    with a host: ``importer/logs/launcher.py``), or a stated global rank of 8 or more. (A stated rank above the
    devices an excerpt shows is no proof: it shows only some of them.)"""
    hosts = sorted({str(h) for h in frame["host"] if str(h)})
    if len(hosts) > 1:
        return f"{len(hosts)} hosts"
    if named := [h for h in hosts if NODE_NAME.search(h)]:
        return f"host {named[0]} is named as one node of several"
    nodes = frame[frame["kind"] == "nodes"]
    if not nodes.empty:
        return f"the lines say {nodes.iloc[0]['text'][:60]!r}"
    if far := _reached(frame, hosts):
        return (
            f"NCCL on {hosts[0] if hosts else 'a host'} connects to a peer at {far} (another node)"
        )
    pdsh = frame[frame["kind"].isin(("traceback", "child_failed")) & (frame["host"] != "")]
    if len(pdsh) and any(k == "traceback" or d.get("source") == "deepspeed_launcher"
           for k, d in zip(pdsh["kind"], pdsh["detail"], strict=True)):  # fmt: skip
        return "the lines carry pdsh's host prefix (a launcher of several hosts)"
    ranked = frame.loc[frame["rank"] >= 0, "rank"]
    if len(ranked) and ranked.max() >= 8:
        return f"rank {int(ranked.max())} is stated (more than one node's GPUs)"
    return ""


NET_CATEGORIES = ("connect_failed", "ib_completion", "ib_async", "ib_verbs", "net")
"""``nccl_warn`` categories of NCCL's network code (sockets, IB): a peer address in one is
the other end of a connection between nodes."""


def _reached(frame: pd.DataFrame, hosts: list[str]) -> str:
    """The peer address an NCCL network warning names, where it is not the one host seen
    (sglang#5594: ``h100-15:139:1092 [7] ... socketStartConnect: Connect to
    10.0.0.82<38455> failed``): a job whose processes connect to another machine; ""."""
    w = frame[frame["kind"] == "nccl_warn"]
    for d in w["detail"] if len(w) else []:
        far = str(d.get("remote") or "")
        if d.get("category") in NET_CATEGORIES and far and far not in hosts:
            return far
    return ""


def _multi_gpu(frame: pd.DataFrame) -> bool:
    """Whether a process's lines show several CUDA devices (``detail.devices`` of NCCL's
    ``present`` event: nccl#1283's pid 2657296 prints ``[0]`` and ``[1]``): one process
    driving several GPUs, so a device index is no rank."""
    return any(len(d.get("devices") or []) > 1 for d in frame["detail"]) if len(frame) else False


def _locals(frame: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """Lines that give only a local rank (``[default3]:``, NCCL's ``[cudaDev]``, torchrun's
    old ``local_rank: 3``): the global rank where the log shows one node and nothing says
    the job spans several (:func:`several_nodes`), the processes' local ranks are distinct
    (one GPU each, no process driving several: :func:`_multi_gpu`) and no process whose global rank a line states has another local rank
    (UniWorld#46: rank 6 on cudaDev 2). Otherwise a local rank stays "host H, GPU N"."""
    todo = (frame["rank"] < 0) & (frame["local_rank"] >= 0)
    if not todo.any():
        return frame, ""
    both = frame[(frame["rank"] >= 0) & (frame["local_rank"] >= 0)]
    if (both["rank"] != both["local_rank"]).any():  # rank 6 on cudaDev 2: not the first node
        return frame, ""
    procs = frame[todo & (frame["pid"] >= 0)].drop_duplicates(["host", "pid"])
    if several_nodes(frame) or procs["local_rank"].duplicated().any() or _multi_gpu(frame):
        return frame, ""
    frame.loc[todo, "rank"] = frame.loc[todo, "local_rank"]
    frame.loc[todo, "mapped"] = True
    return frame, "one node seen: a local rank is taken as the global rank"


def evidence_of(events: pd.DataFrame) -> Evidence:
    """:class:`Evidence` of a ``log_events`` frame (any subset of its columns' rows)."""
    frame = events.copy().reset_index(drop=True)
    frame["detail"] = [_loads(d) for d in frame.get("detail", pd.Series([], dtype=str))]
    frame["mapped"] = False  # True: the global rank was read from a local rank
    frame, assumed = _unnamed(_with_groups(frame))
    frame, local = _locals(_same_process(frame))
    told = [bool(d.get("assumed")) for d in frame["detail"]]  # a line format's own inference
    frame.loc[told, "mapped"] = True
    said = sorted({str(d["assumed"]) for d in frame["detail"] if d.get("assumed")})
    assumed = "; ".join(x for x in (assumed, local, *said) if x)
    named = frame[frame["kind"].isin(NAMED) & (frame["rank"] >= 0)]
    present = {int(r) for r in named["rank"]}
    ev = Evidence(frame, present, assumed=assumed)
    sizes = []
    for _, e in frame[frame["kind"] == "world"].iterrows():
        if int(e["code"]) > 0:
            sizes.append((int(e["code"]), str(e["detail"].get("source", "world size"))))
    for n in frame.loc[frame["kind"] == "init_failure", "code"]:
        if int(n) > 0:
            sizes.append((int(n), "the store's expected workers"))
    for _, e in frame[frame["kind"] == "fr_missing"].iterrows():
        if int(e["code"]) > 0 and e["detail"].get("source") == "fr_trace":
            sizes.append((int(e["code"]), "fr_trace's expected ranks"))
    top = max(present | _named_inside(frame), default=-1) + 1
    if top == 1 and (frame["kind"] == "timeout").any():  # a collective that waits has a peer
        top, ev.bound = 2, "as a collective that timed out has another member"
    group = _group_size(frame)
    if group:
        n, default = group
        if default:
            sizes.append((n, "all_gather/reduce_scatter sizes of the default group"))
        elif n > top:  # a group is no larger than the world (DeepEP#411: 16 of PG 1)
            top, ev.bound = n, "the size of a group's all_gather/reduce_scatter (NumelOut/NumelIn)"
    if sizes:
        n, src = max(sizes)
        ev.world, ev.world_exact, ev.world_source = max(n, top), n >= top, src
    else:
        ev.world = top
    return ev


def _named_inside(frame: pd.DataFrame) -> set[int]:
    """Ranks another rank's message names (a fingerprint mismatch's other rank, the ranks
    of a desync report, the communicator ranks of an NCCL channel over the network):
    they exist, so the world is larger than they are, though they left no line of their
    own (OpenDDE#23: rank 1's error names rank 2; sglang#3836: ``15[7] -> 7[7] via NET``)."""
    mm = frame.loc[frame["kind"] == "mismatch", "peer"]
    dr = frame.loc[frame["kind"] == "desync_report", ["rank", "peer"]].to_numpy().ravel()
    comm = [r for d in frame.loc[frame["kind"] == "nodes", "detail"]
            for r in d.get("comm_ranks", ())]  # fmt: skip
    return {int(r) for r in [*mm, *dr, *comm] if 0 <= int(r) < 100_000}


def _group_size(frame: pd.DataFrame) -> tuple[int, bool] | None:
    """(members, in the default group) of the largest group whose size a timed-out
    all_gather (NumelOut / NumelIn) or reduce_scatter (NumelIn / NumelOut) gives."""
    t = frame[frame["kind"] == "timeout"]
    best = None
    for op, nin, nout, pg, name in zip(t["op"], t["numel_in"], t["numel_out"], t["pg"],
                                       t["pg_name"], strict=True):  # fmt: skip
        small, big = (nin, nout) if op in ("all_gather", "coalesced") else (nout, nin)
        if op not in ("all_gather", "coalesced", "reduce_scatter") or not 0 < small < big:
            continue
        if big % small or big // small > 100_000:
            continue
        n, default = big // small, pg in DEFAULT_PG or name == "default_pg"
        if best is None or (n, default) > best:
            best = (n, default)
    return best


def _loads(text) -> dict:
    try:
        d = json.loads(text) if isinstance(text, str) and text else {}
    except ValueError:
        return {}
    return d if isinstance(d, dict) else {}


def finding(kind: str, cause: str, rank: int, conf: float, summary: str, evidence: dict,
            coords: pd.DataFrame, host: str = "") -> Finding:  # fmt: skip
    """A log finding: mesh coordinates from ``coords`` where the rank has them (logs
    rarely say), ``impact_pct`` 100 (the job stopped), ``confidence`` rounded. ``kind``
    and ``cause`` are words of ``ranksight.ground.vocab``; an unknown one raises ValueError."""
    c = coords_at(coords, rank) if rank >= 0 else NO_COORDS
    evidence = {k: _short(k, v) for k, v in evidence.items()}
    return Finding(kind=kind_of(kind), cause=cause_of(cause), culprit_rank=int(rank),
                   host=host or str(c.get("host", "") or ""), dp=int(c.get("dp", -1)),
                   tp=int(c.get("tp", -1)), pp=int(c.get("pp", -1)),
                   confidence=round(float(conf), 2), impact_pct=100.0, summary=summary,
                   evidence=evidence)  # fmt: skip


LONG_LIST = 32
"""Rank lists longer than this are kept in evidence as ranges (``0-4095``)."""


def _short(key: str, value):
    """Evidence stays short: a long list of ranks as ranges, ``suspects`` as sorted unique
    ranks (at most 1,024)."""
    if not isinstance(value, list) or not value or not all(isinstance(v, int) for v in value):
        return value
    if key == "suspects":
        return sorted(set(value))[:1024]
    return span(value, limit=64) if len(value) > LONG_LIST else value


def ranks_text(ranks) -> str:
    """``rank 3`` or ``ranks 0-5,7``."""
    rs = sorted(set(ranks))
    return f"rank {rs[0]}" if len(rs) == 1 else f"ranks {span(rs)}"
