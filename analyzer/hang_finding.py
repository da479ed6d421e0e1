"""A localized hang as a Finding: who everyone waits for, in which op, and why."""

from __future__ import annotations

import pandas as pd

from ranksight.words import counted, span

from .findings import Finding
from .hang import HangReport


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
    report: HangReport, coords: pd.DataFrame, names: dict[str, str] | None = None
) -> Finding:
    """The Finding for ``report``: culprit the first root; kind and cause ``crash`` if
    its snapshots stopped (the process is gone: the hang is its consequence), else
    ``hang`` ``stuck`` (alive, in no collective);
    with no root (every rank entered the op that never completes, e.g. a desync) culprit
    -1 and cause ``all_blocked``. Impact 100% (no step completes). ``names``: each
    process group's name (:func:`~ranksight.analyzer.groups.group_names`), carried in the
    evidence as ``group`` beside its id."""
    names = names or {}
    root = report.roots[0] if report.roots else -1  # none: every rank is inside the stuck op
    c = coords.loc[root] if root in coords.index else {"dp": -1, "tp": -1, "pp": -1, "host": ""}
    cause = "crash" if root in report.gone else ("stuck" if root >= 0 else "all_blocked")
    ops = _ops_waiting_on(report, root, names)
    first = ops[0] if ops else {"op": "?", "seq": -1, "blocked_ranks": [], "group": ""}
    blocked = sorted(report.blocked)
    how = (
        "its process stopped reporting"
        if cause == "crash"
        else "it is alive but not inside any collective"
    )
    summary = (
        f"job hung for {report.stalled_s:.0f} s: rank {root} (dp={c['dp']}, tp={c['tp']}, "
        f"pp={c['pp']}, host {c['host']}) never entered {first['op']} #{first['seq']}"
        f"{' of the ' + first['group'] if first['group'] else ''}; "
        f"{how}; {counted(len(blocked), 'rank')} ({span(blocked)}) are blocked waiting"
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
