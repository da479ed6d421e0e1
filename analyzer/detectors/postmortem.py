"""Hangs and desyncs from what a stopped job left behind (Flight Recorder dumps, watchdog
logs, NCCL debug logs, py-spy dumps), once imported (``ranksight import``).

Unlike the live hang analysis (``hang.py``), which watches progress stop, these are one
snapshot per rank, and with NCCL every rank has work queued that never completed. So:

- **Stopped completing**: a rank that issued op ``n`` of a group, which some other member
  completed while it did not, stopped completing work (a GPU error, a dead stream): a
  collective completes on all members at about the same time. This names a rank that
  queued the next collectives normally and looks healthy by what it enqueued. (NVIDIA's
  Flight Recorder analysis compares what was enqueued; completion is what tells here.)
- **Never entered**: with no such rank, the members that issued fewer ops of a group
  than the others (the first op they are missing is where everyone else waits).
- **Odd stack out**: among py-spy dumps, the ranks whose main-thread stack differs from
  the majority's; the stack says why (data loader, checkpoint, a collective...).

A rank with no artifact at all is never blamed: the notes say what cannot be decided
about it. P2P groups (``direction`` "p2p") are left out: their members do not issue in
lockstep.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd

from ranksight.ground.vocab import Kind, cause_of
from ranksight.ground.words import counted

from ..findings import Finding, finding_at
from ..folds import prepend
from ..imported import partial_ranks
from .base import Detector, RunContext, Stage

if TYPE_CHECKING:
    from ..queries import RunData

GPU_SYNC = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaStreamQuery",
            "_local_scalar_dense", "synchronize (torch/cuda", "cudaMemcpy")  # fmt: skip
"""A host thread waiting for its GPU's stream (``torch.cuda.synchronize``, a tensor's
``.item()``): in a hang, most often for a collective's kernel that does not finish."""
STACK_CAUSES = (
    ("data_loader", ("torch/utils/data", "dataloader", "_next_data", "DataLoader")),
    ("checkpoint", ("checkpoint", "torch/serialization", "save_state_dict")),
    (
        "communication",
        (
            "distributed_c10d",
            "all_reduce",
            "barrier",
            "all_gather",
            "broadcast",
            "allreduce",
            "allgather",
            *GPU_SYNC,
        ),
    ),
    ("gc", ("gc.collect",)),
)
"""Stack keywords -> cause, first match wins (innermost frames first)."""


STOPPED_STRONG = 0.85
"""Confidence of "stopped completing" when few of the ranks did (at most a quarter of
those with a dump) and two or more others completed the op: 2 of 16 is strong."""
STOPPED_WEAK = 0.6
"""... and when the evidence is thinner (1 of 3 ranks): one hypothesis among others."""


def _members(text: str) -> list[int]:
    return [int(x) for x in str(text).split(",") if x.strip().lstrip("-").isdigit()]


def stopped_completing(latest: pd.DataFrame) -> dict[int, dict]:
    """rank -> {group_id, seq, op, completed_by} for ranks that issued an op another member
    completed but did not complete it themselves (first such group by sequence)."""
    out: dict[int, dict] = {}
    coll = latest[latest["direction"] == ""]
    for gid, rows in coll.groupby("group_id"):
        done = dict(zip(rows["rank"].astype(int), rows["completed"].astype(int), strict=True))
        issued = dict(zip(rows["rank"].astype(int), rows["issued"].astype(int), strict=True))
        for r, c in done.items():
            others = {m: d for m, d in done.items() if m != r}
            n = c + 1
            if n > issued[r] or not others or max(others.values()) < n:
                continue
            by = sorted(m for m, d in others.items() if d >= n)
            op = rows.loc[rows["rank"] == r, "op"].iloc[0]
            if r not in out or out[r]["seq"] > n:
                out[r] = {"group_id": gid, "seq": n, "op": op, "completed_by": by,
                          "own_completed": c, "own_issued": issued[r]}  # fmt: skip
    return out


def never_entered(latest: pd.DataFrame) -> tuple[dict[int, dict], dict]:
    """(rank -> {group_id, seq, waiting}, undecided group -> ranks without evidence):
    members of a group that issued fewer ops than the most any member issued. Members with
    no row for the group are undecided, with a dump or not: a Flight Recorder ring holds
    only its latest entries (and some dumps only the unfinished ones), so a ring with no
    recent entry of a group says nothing of how far the rank got there."""
    out: dict[int, dict] = {}
    undecided: dict[str, list[int]] = {}
    coll = latest[latest["direction"] == ""]
    for gid, rows in coll.groupby("group_id"):
        issued = dict(zip(rows["rank"].astype(int), rows["issued"].astype(int), strict=True))
        top = max(issued.values())
        for m in _members(rows["members"].iloc[0]):
            if m not in issued:
                undecided.setdefault(gid, []).append(m)
        waiting = sorted(r for r, n in issued.items() if n == top)
        at_top = rows[rows["issued"] == top]
        done = at_top["completed"]
        stuck_at = int(done.min()) + 1 if len(done) else 0  # the op the others wait in
        last_ops = {str(o) for o in at_top["op"] if str(o)}
        top_op = last_ops.pop() if len(last_ops) == 1 else ""
        for r, n in issued.items():
            seq = max(n + 1, stuck_at)
            op = top_op if seq == top else ""  # known where it is the waiters' last issued
            if n < top and (r not in out or out[r]["seq"] > seq):
                out[r] = {"group_id": gid, "seq": seq, "op": op, "issued": n,
                          "others_issued": top, "waiting": waiting}  # fmt: skip
    return out, undecided


def stack_cause(summary: str) -> str:
    """Cause read from a stack summary (:data:`STACK_CAUSES`), else ``stuck``."""
    for cause, words in STACK_CAUSES:
        if any(w in summary for w in words):
            return cause
    if "queue.py" in summary and "__next__" in summary:  # a prefetching data iterator's get
        return "data_loader"
    return "stuck"


def odd_stacks(stacks: pd.DataFrame) -> dict[int, dict]:
    """rank -> {stack, cause, majority_ranks, majority_stack} for ranks whose main-thread
    stack differs from the one most ranks share (only when that majority is larger than
    all the others together)."""
    from ranksight.collectors.pyspy import main_thread

    if stacks.empty:
        return {}
    main = {
        int(r): main_thread(s) for r, s in zip(stacks["rank"], stacks["stack_summary"], strict=True)
    }
    groups: dict[str, list[int]] = {}
    for r, s in main.items():
        groups.setdefault(s, []).append(r)
    if len(groups) < 2:
        return {}
    top, members = max(groups.items(), key=lambda kv: len(kv[1]))
    if len(members) * 2 <= len(main):
        return {}
    return {
        r: {"stack": s, "cause": stack_cause(s), "majority_ranks": sorted(members),
            "majority_stack": top, "majority_cause": stack_cause(top)}
        for s, rs in groups.items() if s != top for r in rs
    }  # fmt: skip


def _finding(
    rank: int, coords: pd.DataFrame, cause: str, summary: str, evidence: dict, conf: float
) -> Finding:
    return finding_at(
        Kind.HANG, cause_of(cause), rank, coords, confidence=conf, impact_pct=100.0,
        summary=summary, evidence=evidence,
    )  # fmt: skip


def postmortem_findings(
    latest: pd.DataFrame,
    stacks: pd.DataFrame,
    coords: pd.DataFrame,
    world_size: int,
    partial: dict[int, str] | None = None,
) -> tuple[list[Finding], list[str]]:
    """Hang findings and notes from imported snapshots (see the module doc).
    ``latest``: ``hang.LATEST``'s frame; ``stacks``: rank, stack_summary; ``coords``: rank
    -> dp, tp, pp, host of every rank with any artifact; ``partial``: rank -> why its
    artifact tells nothing of its progress (a truncated dump): such a rank is undecided,
    never taken to have issued nothing."""
    partial = partial or {}
    have = set(int(r) for r in coords.index) - set(partial)
    findings: list[Finding] = []
    notes: list[str] = [
        f"rank {r}'s Flight Recorder dump is cut short ({why}): how far it got cannot be "
        "decided from it"
        for r, why in sorted(partial.items())
    ]
    stack_of = odd_stacks(stacks)
    stopped = stopped_completing(latest) if not latest.empty else {}
    behind, undecided = never_entered(latest) if not latest.empty else ({}, {})
    for r, e in sorted(stopped.items()):
        summary = (
            f"rank {r} stopped completing work: it issued {e['op'] or 'op'} #{e['seq']} in "
            f"{e['group_id']}, which ranks {e['completed_by']} completed, but its own last "
            f"completed op is #{e['own_completed']} (issued up to #{e['own_issued']}); a GPU "
            "or communicator failure on this rank, not a missing call"
        )
        strong = len(stopped) * 4 <= len(have) and len(e["completed_by"]) >= 2
        alts = [
            "the op's completion was not yet recorded when the dump was taken (a dump "
            "taken mid-op, or TORCH_NCCL_ENABLE_TIMING off)",
            "a collective's root (broadcast, reduce) may finish before its receivers",
        ]  # fmt: skip
        findings.append(_finding(r, coords, "stopped_completing", summary,
                                 {**e, "alternatives": alts, "suspects": [r]},
                                 STOPPED_STRONG if strong else STOPPED_WEAK))  # fmt: skip
    if not stopped:
        for r, e in sorted(behind.items()):
            stack = stack_of.pop(r, None)
            cause = stack["cause"] if stack else "stuck"
            got = f"issued up to #{e['issued']}" if e["issued"] >= 0 else "reported none of it"
            waiting = e["waiting"]
            who = (
                f"rank {waiting[0]} is blocked in it"
                if len(waiting) == 1
                else f"ranks {waiting} are blocked in it"
            )
            summary = (
                f"rank {r} never entered {e['op'] or 'op'} #{e['seq']} of {e['group_id']} "
                f"({got}, the others up to #{e['others_issued']}); {who}"
                + (f"; its stack: {stack['stack']}" if stack else "")
            )
            findings.append(_finding(r, coords, cause, summary, {**e, "stack": stack}, 0.8))
    for r, s in sorted(stack_of.items()):
        if any(f.culprit_rank == r for f in findings):
            continue
        summary = (
            f"rank {r}'s stack differs from that of the {counted(len(s['majority_ranks']), 'other rank')} "
            f"({s['majority_cause']}): it is in {s['cause']}: {s['stack']}"
        )
        findings.append(_finding(r, coords, s["cause"], summary, s, 0.7))
    snapshots = not latest.empty or not stacks.empty
    missing = (
        sorted(set(range(world_size)) - have - set(partial))
        if snapshots and 0 < world_size <= 100_000
        else []
    )
    if missing:
        notes.append(
            f"no artifact from ranks {_span(missing)} of {world_size}: whether they issued or "
            "completed their ops cannot be decided; the findings rest on the other ranks"
        )
    for gid, ranks in sorted(undecided.items())[:20]:
        if left := sorted(r for r in ranks if r not in partial):
            notes.append(f"{gid}: members {_span(left)} left nothing, undecided there")
    return findings, notes


def _span(ranks: list[int]) -> str:
    return ",".join(map(str, ranks[:32])) + (f",... ({len(ranks)})" if len(ranks) > 32 else "")


def postmortem(data: RunData, coords: pd.DataFrame) -> tuple[list[Finding], list[str]]:
    """:func:`postmortem_findings` over the run's loaded frames."""
    world = int(data.ranks["world_size"].max()) if not data.ranks.empty else 0
    return postmortem_findings(data.progress, data.stacks, coords, world, partial_ranks(data.run))


def detect(run: RunContext, found: list[Finding]) -> tuple[list[Finding], list[str]]:
    """:func:`postmortem` of an imported run."""
    return postmortem(run.data, run.coords)


DETECTOR = Detector(Kind.HANG, Stage.STOP, detect, imported_only=True, fold=prepend)
