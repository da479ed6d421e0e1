"""Hangs, localized from progress rather than timeouts.

Every rank's hooks snapshot, every few seconds and from a thread that keeps running while
training is stuck, how far each process group (and each P2P peer and direction) has been
issued and completed. A hang is a run whose snapshots keep arriving while no step has
ended for ``stall_s``. Then, per group, the ranks that never entered the op the others
are blocked in are "missing"; following blocked -> missing edges through the mesh (TP,
PP neighbours, DP) leads to the root: a rank missing from some op and blocked in none
(stuck outside communication), or a rank whose snapshots stopped (its process is gone).
This is what PyTorch's Flight Recorder analysis (fr_trace) does from dumps after the
watchdog fires; here it runs live, seconds after the stop, not 10 minutes later.

Query: :data:`LATEST` (each rank's latest progress snapshot per group). A stall the job
got over (no step for many median steps, then steps again) is a hang finding too
(:func:`recovered_stalls`). The finding: who everyone waits for, in which op, and why.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from ranksight.ground.sql import RUN as _RUN
from ranksight.ground.vocab import Kind, cause_of
from ranksight.ground.words import counted, span

from ..findings import Finding, coords_at, finding_at, rank_place
from ..folds import each_hang
from ..groups import group_names
from .base import Detector, RunContext, Stage, of_kind
from .crash import crash_report

LATEST = f"""
SELECT rank, group_id, direction, peer,
       argMax(issued_seq, ts_ns) AS issued, argMax(completed_seq, ts_ns) AS completed,
       argMax(last_op, ts_ns) AS op, argMax(group_ranks, ts_ns) AS members,
       max(ts_ns) AS seen_ns, argMax(step, ts_ns) AS at_step
FROM progress WHERE {_RUN}
GROUP BY rank, group_id, direction, peer
"""


@dataclass(frozen=True, slots=True, kw_only=True)
class HangConfig:
    """When a run counts as hung."""

    stall_s: float = 20.0
    """No step ended for this long (s) while progress snapshots keep coming."""
    gone_s: float = 8.0
    """A rank whose snapshots stopped this long (s) before the newest is gone (dead)."""

    def __post_init__(self) -> None:
        if self.stall_s <= 0 or self.gone_s <= 0:
            raise ValueError("stall_s and gone_s must be > 0")


@dataclass(frozen=True)
class HangReport:
    """A localized hang: the root rank(s), who waits for whom, and in which ops."""

    roots: list[int]
    gone: list[int]
    stalled_s: float
    waits: list[dict] = field(default_factory=list)  # {waiter, holder, group_id, op, seq, kind}
    blocked: dict[int, dict] = field(default_factory=dict)  # rank -> {group_id, op, seq}


def _members(s: str) -> list[int]:
    return [int(x) for x in str(s).split(",") if x != ""]


def wait_edges(latest: pd.DataFrame) -> tuple[list[dict], dict[int, dict]]:
    """Blocked -> missing edges from the latest snapshot per (rank, group, direction,
    peer): in a collective group, a rank blocked in seq n waits for members that have not
    issued n; a rank blocked in a recv waits for the peer whose matching send is not
    issued, and one whose send never completed for the peer that has not posted the
    matching recv."""
    edges, blocked = [], {}
    coll = latest[latest["direction"] == ""]
    for gid, rows in coll.groupby("group_id"):
        issued = dict(zip(rows["rank"].astype(int), rows["issued"], strict=True))
        for member in _members(rows["members"].iloc[0]):
            issued.setdefault(member, -1)
        for r in rows[rows["completed"] < rows["issued"]].itertuples():
            blocked[int(r.rank)] = {"group_id": gid, "op": r.op, "seq": int(r.issued)}
            for m, n in issued.items():
                if n < r.issued:
                    edges.append(
                        {
                            "waiter": int(r.rank),
                            "holder": m,
                            "group_id": gid,
                            "op": r.op,
                            "seq": int(r.issued),
                            "kind": "collective",
                        }
                    )
    p2p = latest[latest["direction"] != ""]
    posted = {
        (d, int(r.rank), int(r.peer), r.group_id): int(r.issued)
        for d in ("send", "recv")
        for r in p2p[p2p["direction"] == d].itertuples()
    }
    pending = p2p[p2p["completed"] < p2p["issued"]]
    # a recv waits for its peer's send; a send that never completed (pipelining waits on
    # its sends too) waits for the peer's recv
    for d, other in (("recv", "send"), ("send", "recv")):
        for r in pending[pending["direction"] == d].itertuples():
            blocked.setdefault(int(r.rank), {"group_id": r.group_id, "op": d, "seq": int(r.issued)})
            if posted.get((other, int(r.peer), int(r.rank), r.group_id), -1) < r.issued:
                edges.append(
                    {
                        "waiter": int(r.rank),
                        "holder": int(r.peer),
                        "group_id": r.group_id,
                        "op": d,
                        "seq": int(r.issued),
                        "kind": "p2p",
                    }
                )
    return edges, blocked


def roots_of(edges: list[dict], blocked: dict[int, dict], gone: list[int]) -> list[int]:
    """Holders reachable from the blocked ranks that are not blocked themselves (or are
    gone): the ranks everyone ends up waiting for."""
    holders = {e["holder"] for e in edges}
    return sorted(r for r in holders if r not in blocked or r in gone)


def find_hang(
    latest: pd.DataFrame, last_step_end_ns: int, cfg: HangConfig | None = None
) -> HangReport | None:
    """The hang in a run, or None if it is progressing. ``latest``: the LATEST query's
    frame; ``last_step_end_ns``: the newest step end over all ranks (ns)."""
    cfg = cfg or HangConfig()
    if latest.empty:
        return None
    newest = int(latest["seen_ns"].max())
    stalled_s = (newest - last_step_end_ns) / 1e9
    if stalled_s < cfg.stall_s:
        return None
    seen = latest.groupby("rank")["seen_ns"].max()
    gone = sorted(int(r) for r, t in seen.items() if (newest - t) / 1e9 >= cfg.gone_s)
    edges, blocked = wait_edges(latest)
    if not blocked and not gone:
        return None
    roots = roots_of(edges, blocked, gone) or gone
    return HangReport(roots=roots, gone=gone, stalled_s=stalled_s, waits=edges, blocked=blocked)


def stopped_now(states: pd.DataFrame) -> dict[int, str]:
    """rank -> its stopped state, for the ranks the agent last saw stopped and not
    running again since. ``states``: ``crash.CRASH_STACKS`` rows (``stopped_ns``,
    ``stopped_state``, ``continued_ns``); empty or without them: none."""
    if states.empty or "stopped_ns" not in states.columns:
        return {}
    now = states[(states["stopped_ns"] > 0) & (states["stopped_ns"] > states["continued_ns"])]
    return {int(r.rank): str(r.stopped_state) for r in now.itertuples()}


@dataclass(frozen=True, slots=True)
class Stall:
    """A step during which the whole job stood still, then went on (a recovered hang)."""

    step: int
    start_ns: int
    end_ns: int
    median_ns: float
    """The run's median job step (ns)."""


STALL_TIMES = 10.0
"""A recovered stall's step took at least this many times the median step (and at least
``HangConfig.stall_s``): a step 10x the usual is no straggler's jitter."""


def recovered_stalls(steps: pd.DataFrame, cfg: HangConfig | None = None) -> list[Stall]:
    """Steps that took at least ``cfg.stall_s`` and :data:`STALL_TIMES` x the median job
    step, on the job as a whole: from the first rank's start to the last rank's end.
    ``steps``: rank, step, start_ns, end_ns (ns). The live analysis saw these as hangs;
    once the job went on they are still the thing to report."""
    cfg = cfg or HangConfig()
    if steps.empty:
        return []
    job = steps.groupby("step").agg(start_ns=("start_ns", "min"), end_ns=("end_ns", "max"))
    took = job["end_ns"] - job["start_ns"]
    median = float(took.median())
    long = job[(took >= cfg.stall_s * 1e9) & (took >= STALL_TIMES * median)]
    return [Stall(int(s), int(r.start_ns), int(r.end_ns), median) for s, r in long.iterrows()]


STOP_WORDS = {"state T": "stopped (SIGSTOP, state T)", "state t": "stopped by a debugger (state t)"}
"""The agent's stopped state (``agent/stall.py``) -> the report's words."""
PEER_STACK_CHARS = 2000
"""Of each blocked rank's stack summary kept in a hang's evidence."""


def stop_words(state: str) -> str:
    """``"stopped (SIGSTOP, state T)"`` for the agent's ``"state T: ..."``."""
    return next((w for k, w in STOP_WORDS.items() if state.startswith(k)), f"stopped ({state})")


def _ops_waiting_on(report: HangReport, root: int, names: dict[str, str]) -> list[dict]:
    seen, out = set(), []
    for e in report.waits:
        key = (e["group_id"], e["op"], e["seq"])
        if e["holder"] == root and key not in seen:
            seen.add(key)
            waiters = sorted(
                {
                    w["waiter"]
                    for w in report.waits
                    if w["holder"] == root and (w["group_id"], w["op"], w["seq"]) == key
                }
            )
            out.append(
                {
                    "group_id": e["group_id"],
                    "group": names.get(e["group_id"], f"group {e['group_id']}"),
                    "op": e["op"],
                    "seq": e["seq"],
                    "kind": e["kind"],
                    "blocked_ranks": waiters,
                }
            )
    return out


def hang_finding(
    report: HangReport,
    coords: pd.DataFrame,
    names: dict[str, str] | None = None,
    stopped: dict[int, str] | None = None,
    stacks: pd.DataFrame | None = None,
) -> Finding:
    """The Finding for ``report``: culprit the first root; kind ``hang`` cause
    ``stopped`` if the agent sees its process stopped (``stopped``: rank -> state,
    :func:`~ranksight.analyzer.hang.stopped_now`: alive, so a hang, not a crash); kind
    and cause ``crash`` if its snapshots stopped otherwise (the process is gone: the hang
    is its consequence); else ``hang`` ``stuck`` (alive, in no collective); with no root
    (every rank entered the op that never completes, e.g. a desync) culprit -1 and cause
    ``all_blocked``. Impact 100% (no step completes). ``names``: each process group's
    name (:func:`~ranksight.analyzer.groups.group_names`), carried in the evidence as
    ``group`` beside its id. ``stacks``: rank, stack_summary (the agent's py-spy dumps);
    the blocked ranks' are the evidence of where they wait."""
    names, stopped = names or {}, stopped or {}
    root = report.roots[0] if report.roots else -1  # none: every rank is inside the stuck op
    c = coords_at(coords, root)
    cause = (
        "stopped"
        if root in stopped
        else "crash"
        if root in report.gone
        else ("stuck" if root >= 0 else "all_blocked")
    )
    ops = _ops_waiting_on(report, root, names)
    first: dict[str, Any] = (
        ops[0] if ops else {"op": "?", "seq": -1, "blocked_ranks": [], "group": ""}
    )
    blocked = sorted(report.blocked)
    entered = (
        f"never entered {first['op']} #{first['seq']}"
        f"{' of the ' + first['group'] if first['group'] else ''}"
        if ops
        else "is not inside the collective the others wait in"
    )
    who = rank_place(root, c)
    what = {
        "crash": f"{entered}; its process stopped reporting",
        "stopped": f"is {stop_words(stopped.get(root, ''))}, alive: it {entered}",
    }.get(cause, f"{entered}; it is alive but not inside any collective")
    summary = (
        f"job hung for {report.stalled_s:.0f} s: {who} {what}; "
        f"{counted(len(blocked), 'rank')} ({span(blocked)}) "
        f"{'are' if len(blocked) != 1 else 'is'} blocked waiting"
    )
    evidence = {
        "roots": report.roots,
        "gone": report.gone,
        "stalled_s": round(report.stalled_s, 1),
        "waiting_on_root": ops,
        "blocked": {
            str(r): {**b, "group": names.get(b.get("group_id", ""), f"group {b.get('group_id')}")}
            for r, b in report.blocked.items()
        },
    }
    if root in stopped:
        evidence["stopped_state"] = stopped[root]
    own = _stacks_of(stacks, [int(root)]) if root >= 0 and root not in stopped else {}
    if own:
        evidence["culprit_stack"] = own[str(int(root))]
    peer_stacks = _stacks_of(stacks, blocked)
    if peer_stacks:
        evidence["blocked_stacks"] = peer_stacks
    return finding_at(
        Kind.CRASH if cause == "crash" else Kind.HANG,
        cause_of(cause),
        int(root),
        coords,
        confidence=0.9 if ops else 0.6,
        impact_pct=100.0,
        summary=summary,
        evidence=evidence,
    )


def _stacks_of(stacks: pd.DataFrame | None, ranks: list[int]) -> dict[str, str]:
    """rank -> its latest stack summary (cut to :data:`PEER_STACK_CHARS`), of ``ranks``."""
    if stacks is None or stacks.empty or "stack_summary" not in stacks.columns:
        return {}
    mine = stacks[stacks["rank"].isin(ranks)]
    return {str(int(r.rank)): str(r.stack_summary)[:PEER_STACK_CHARS] for r in mine.itertuples()}


def _self_in_step(totals: pd.DataFrame, step: int) -> pd.Series:
    """rank -> its own (not waiting) time in ``step`` (ns), from ``PHASE_TOTALS`` rows
    (compute_self, data_self) or ``PHASES`` rows (self_ns)."""
    rows = totals[totals["step"] == step] if not totals.empty else totals
    if rows.empty:
        return pd.Series(dtype=float)
    if "compute_self" in rows.columns:
        return (rows["compute_self"] + rows["data_self"]).groupby(rows["rank"]).sum()
    return rows.groupby("rank")["self_ns"].sum()


def recovered_finding(
    stall: Stall,
    coords: pd.DataFrame,
    states: pd.DataFrame,
    totals: pd.DataFrame,
    run_ns: float,
) -> Finding:
    """The Finding for a recovered stall (:func:`~ranksight.analyzer.hang.recovered_stalls`):
    kind ``hang``; culprit the rank the agent saw stopped during it (cause ``stopped``),
    else the rank whose own time fills most of the step (cause ``stuck``: it was busy or
    blocked outside any collective while the others waited), else -1 (``all_blocked``).
    ``states``: ``crash.CRASH_STACKS`` rows; ``totals``: per-rank step self times;
    ``run_ns``: the analyzed steps' summed time, for the impact (the stall's share)."""
    took = stall.end_ns - stall.start_ns
    stops = pd.DataFrame()
    if not states.empty and "stopped_ns" in states.columns:
        stops = states[states["stopped_ns"].between(stall.start_ns, stall.end_ns)]
    own = _self_in_step(totals, stall.step)
    if not stops.empty:
        rank, cause = int(stops["rank"].iloc[0]), "stopped"
        how = f"its process was {stop_words(str(stops['stopped_state'].iloc[0]))}, then ran again"
    elif not own.empty and own.max() >= 0.5 * took:
        rank, cause = int(own.idxmax()), "stuck"
        how = (
            f"it spent {own.max() / 1e9:.0f} s of it outside any collective while the others waited"
        )
    else:
        rank, cause, how = -1, "all_blocked", "every rank waited in it"
    c = coords_at(coords, rank)
    who = rank_place(rank, c)
    summary = (
        f"the job stood still for {took / 1e9:.0f} s in step {stall.step} (its median step "
        f"takes {stall.median_ns / 1e6:.0f} ms), then went on: "
        + (f"{who}: {how}" if rank >= 0 else how)
    )
    evidence = {
        "step": stall.step,
        "stalled_s": round(took / 1e9, 1),
        "median_step_ms": round(stall.median_ns / 1e6, 1),
        "recovered": True,
        "self_s": {str(int(r)): round(float(v) / 1e9, 2) for r, v in own.items()},
    }
    if not stops.empty:
        row = stops.iloc[0]
        evidence.update(stopped_state=str(row["stopped_state"]), stopped_ns=int(row["stopped_ns"]),
                        continued_ns=int(row["continued_ns"]))  # fmt: skip
    return finding_at(
        Kind.HANG,
        cause_of(cause),
        rank,
        coords,
        confidence=0.9 if cause == "stopped" else 0.7 if cause == "stuck" else 0.5,
        impact_pct=round(min(100.0, 100.0 * took / run_ns), 1) if run_ns > 0 else 0.0,
        summary=summary,
        evidence=evidence,
    )


MAX_STALLS = 3
"""Recovered stalls reported of one run (the longest first would need a sort: they are
rare; the first three in step order)."""


def detect(run: RunContext, found: list[Finding]) -> tuple[list[Finding], list[str]]:
    """The hang of a hooked run that is not finished and did not crash: its progress
    snapshots kept coming while no step ended (:func:`find_hang`)."""
    d = run.data
    if crash_report(run) is not None or d.run.get("status") == "finished" or d.progress.empty:
        return [], []
    report = find_hang(d.progress, int(d.steps["end_ns"].max()))
    if report is None:
        return [], []
    names = group_names(d.groups, run.coords)
    return [hang_finding(report, run.coords, names, stopped_now(d.crash_stacks), d.stacks)], []


def detect_recovered(run: RunContext, found: list[Finding]) -> tuple[list[Finding], list[str]]:
    """The stalls a hooked run got over (:func:`recovered_stalls`, the first
    :data:`MAX_STALLS`), where it neither crashed nor hangs now."""
    d = run.data
    if crash_report(run) is not None or of_kind(found, Kind.HANG):
        return [], []
    window = d.steps[d.steps["step"].isin(run.steps_in)]
    run_ns = float(run.analyzed.sum())
    return [
        recovered_finding(stall, run.coords, d.crash_stacks, run.totals, run_ns)
        for stall in recovered_stalls(window)[:MAX_STALLS]
    ], []


DETECTOR = Detector(Kind.HANG, Stage.STOP, detect, hooked_only=True, fold=each_hang)
RECOVERED = Detector(Kind.HANG, Stage.STOP, detect_recovered, hooked_only=True, fold=each_hang)
