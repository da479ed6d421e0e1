"""NCCL_DEBUG call counts: a rank that issued fewer collectives on a communicator than
the others, which agree with each other, stopped issuing there.

Counts are compared only where each rank's lines come from a file of its own (a whole
log), never inside one console excerpt, whose window cuts every rank at another point.
"""

from __future__ import annotations

from .evidence import Evidence, finding


def detect(ev: Evidence, coords) -> tuple[list, list[str]]:
    """A hang finding for a rank behind on NCCL calls."""
    c = ev.of("nccl_calls")
    c = c[c["rank"] >= 0]
    out, notes = [], []
    for comm, rows in c.groupby("pg"):
        if rows["rank"].nunique() < 2:
            continue
        if rows["file"].nunique() < rows["rank"].nunique():
            notes.append(f"NCCL calls on {comm}: several ranks in one file, counts not compared "
                         "(an excerpt cuts each rank at another line)")  # fmt: skip
            continue
        calls = {int(r): int(s) + 1 for r, s in zip(rows["rank"], rows["seq"], strict=True)}
        top = max(calls.values())
        behind = sorted(r for r, n in calls.items() if n < top)
        if not behind or len(behind) * 2 >= len(calls):
            continue
        for r in behind:
            out.append(finding(
                "hang", "stuck", r, 0.6 if len(behind) == 1 else 0.4,
                f"hang: rank {r} issued {calls[r]} NCCL calls on {comm}, the others {top}: it "
                f"stopped issuing at call #{calls[r]}",
                {"issued": calls[r] - 1, "others_issued": top - 1, "communicator": comm,
                 "suspects": behind}, coords))  # fmt: skip
    return out + _different_ops(c, coords), notes


def _different_ops(c, coords) -> list:
    """Ranks of one communicator issuing different ops at one opCount (a desync)."""
    out = []
    for comm, rows in c.groupby("pg"):
        if rows["rank"].nunique() < 2:
            continue
        at: dict[str, dict[int, str]] = {}
        for r, d in zip(rows["rank"], rows["detail"], strict=True):
            for count, op in (d.get("at") or {}).items():
                at.setdefault(count, {})[int(r)] = op
        odd = {k: v for k, v in at.items() if len(v) >= 2 and len(set(v.values())) > 1}
        if not odd:
            continue
        count = min(odd, key=int)
        ops = odd[count]
        votes = {op: sorted(r for r, o in ops.items() if o == op) for op in set(ops.values())}
        few = min(votes.values(), key=len)
        lone = len(ops) >= 3 and len(few) == 1 and sum(len(v) == 1 for v in votes.values()) == 1
        what = ", ".join(f"rank {r} {o}" for r, o in sorted(ops.items())[:8])
        out.append(finding(
            "desync", "mismatch", few[0] if lone else -1, 0.6 if lone else 0.45,
            f"desync: at NCCL opCount {int(count):#x} of {comm} the ranks issue different "
            f"collectives ({what})" + ("" if lone else "; which side is wrong the lines do not say"),
            {"communicator": comm, "op_count": int(count), "ops": ops,
             "suspects": few if lone else sorted(ops)}, coords))  # fmt: skip
    return out
