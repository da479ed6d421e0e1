"""A localized hang as a Finding: who everyone waits for, in which op, and why."""

from __future__ import annotations

from typing import Any

import pandas as pd

from ranksight.words import counted, span

from .findings import Finding, coords_at
from .hang import HangReport, Stall

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
    who = f"rank {root} (dp={c['dp']}, tp={c['tp']}, pp={c['pp']}, host {c['host']})"
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
    return Finding(
        kind="crash" if cause == "crash" else "hang",
        cause=cause,
        culprit_rank=int(root),
        host=str(c["host"]),
        dp=int(c["dp"]),
        tp=int(c["tp"]),
        pp=int(c["pp"]),
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
    who = f"rank {rank} (dp={c['dp']}, tp={c['tp']}, pp={c['pp']}, host {c['host']})"
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
    return Finding(
        kind="hang",
        cause=cause,
        culprit_rank=rank,
        host=str(c["host"]),
        dp=int(c["dp"]),
        tp=int(c["tp"]),
        pp=int(c["pp"]),
        confidence=0.9 if cause == "stopped" else 0.7 if cause == "stuck" else 0.5,
        impact_pct=round(min(100.0, 100.0 * took / run_ns), 1) if run_ns > 0 else 0.0,
        summary=summary,
        evidence=evidence,
    )
