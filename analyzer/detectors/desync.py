"""Desync: ranks at the same (group, sequence) issuing different collectives.

As PyTorch's Flight Recorder analysis (``fr_trace``) does from dumps: every member of a
group must issue the same op with the same sizes and dtype at each sequence number; the
first sequence where they differ names the odd rank(s) out. The size compared is the one
every member shares: what each receives for scatter (the root alone sends), none for
all_to_all (splits may be uneven), the input elsewhere.

Query: :data:`MISMATCHES` (the groups whose members' signatures differ, found by
``TRANSFER``'s ``mismatched`` count) and :data:`USUAL`, run by ``queries.load_run``.
"""

from __future__ import annotations

from collections import Counter

import pandas as pd

from ranksight.ground.sql import RUN as _RUN
from ranksight.ground.vocab import Cause, Kind

from ..findings import Finding, finding_at
from .base import Detector, RunContext, Stage

MISMATCHES = f"""
SELECT group_id, group_seq, any(group_ranks) AS members,
       groupArray(rank) AS ranks_list, groupArray(op) AS ops_list,
       groupArray(size) AS sizes_list, groupArray(dtype) AS dtypes_list,
       groupArray(enqueue_ns) AS issued_list,
       uniqExact(op) AS n_ops, uniqExact(size) AS n_sizes, uniqExact(dtype) AS n_dtypes
FROM
(
    SELECT group_id, group_seq, group_ranks, rank, op, dtype, enqueue_ns,
           multiIf(op = 'scatter', numel_out, op = 'all_to_all', toUInt64(0), numel_in) AS size
    FROM collectives WHERE {_RUN} AND peer = -1
      AND group_id IN %(groups)s
)
GROUP BY group_id, group_seq
HAVING n_ops > 1 OR n_sizes > 1 OR n_dtypes > 1
ORDER BY group_seq
LIMIT 1000
"""


USUAL = f"""
SELECT group_id, op, size, dtype, count() AS n
FROM
(
    SELECT group_id, op, dtype,
           multiIf(op = 'scatter', numel_out, op = 'all_to_all', toUInt64(0), numel_in) AS size
    FROM collectives
    WHERE {_RUN} AND peer = -1 AND group_id IN %(groups)s
)
GROUP BY group_id, op, size, dtype
"""
"""How often each (op, size, dtype) occurs in the given groups over the run: where the
members at a mismatched sequence split evenly (a group of two), the signature the group
usually issues is the normal one."""


def odd_ranks(row: dict, usual: dict[tuple, int] | None = None) -> tuple[list[int], dict]:
    """The members whose (op, size, dtype) differs from the majority at this sequence,
    and what each signature was (with its host issue time, ns, where the row has
    ``issued_list``). Ties (one rank against one) are broken by ``usual``: signature ->
    how often the group issued it (:data:`USUAL`)."""
    sigs = [
        (o, int(n), d)
        for o, n, d in zip(row["ops_list"], row["sizes_list"], row["dtypes_list"], strict=True)
    ]
    counts = Counter(sigs)
    usual = usual or {}
    majority = max(counts, key=lambda sig: (counts[sig], usual.get(sig, 0)))
    ranks = [int(r) for r in row["ranks_list"]]
    odd = sorted(r for r, s in zip(ranks, sigs, strict=True) if s != majority)
    seen = {
        str(r): {"op": s[0], "numel": s[1], "dtype": s[2]} for r, s in zip(ranks, sigs, strict=True)
    }
    issued = row.get("issued_list")
    if issued is not None and len(issued) == len(ranks):
        for r, t in zip(ranks, issued, strict=True):
            seen[str(r)]["issued_ns"] = int(t)
    return odd, seen


def issued_after(desync: dict, rank: int, t_ns: int) -> list[int]:
    """The members other than ``rank`` that issued their collective at ``desync``'s
    sequence (a :func:`first_desyncs` entry) after ``t_ns`` (host ns): after a member
    died, the survivors' error handling issues collectives of its own, so a mismatch
    issued then is the death's aftermath, not a desync."""
    return sorted(
        int(r)
        for r, sig in desync["signatures"].items()
        if int(r) != rank and int(sig.get("issued_ns", -1)) > t_ns
    )


def first_desyncs(mismatches: pd.DataFrame, usual: pd.DataFrame | None = None) -> list[dict]:
    """Per group, the first mismatched sequence: group, seq, odd ranks, signatures.
    ``usual``: the USUAL query's rows, to break ties."""
    out = []
    for gid, rows in mismatches.groupby("group_id"):
        row = rows.sort_values("group_seq").iloc[0].to_dict()
        seen_sigs = {}
        if usual is not None and not usual.empty:
            mine = usual[usual["group_id"] == gid]
            seen_sigs = {
                (o, int(n), d): int(c)
                for o, n, d, c in zip(
                    mine["op"], mine["size"], mine["dtype"], mine["n"], strict=True
                )
            }
        odd, seen = odd_ranks(row, seen_sigs)
        out.append(
            {
                "group_id": gid,
                "seq": int(row["group_seq"]),
                "odd_ranks": odd,
                "members": row["members"],
                "signatures": seen,
            }
        )
    return sorted(out, key=lambda d: d["seq"])


def desync_findings(
    mismatches: pd.DataFrame, coords: pd.DataFrame, usual: pd.DataFrame | None = None
) -> list[Finding]:
    """One finding per odd rank at the first mismatched sequence of its group (``usual``:
    the groups' usual signatures, to break one-against-one ties)."""
    out = []
    for d in first_desyncs(mismatches, usual) if not mismatches.empty else []:
        for rank in d["odd_ranks"][:1]:
            mine = d["signatures"][str(rank)]
            summary = (
                f"desync: at {d['group_id']} #{d['seq']} rank {rank} issued {mine['op']} of "
                f"{mine['numel']} {mine['dtype']} elements while the other members "
                "issued something else; the job will hang or compute garbage"
            )
            out.append(
                finding_at(
                    Kind.DESYNC,
                    Cause.MISMATCHED_COLLECTIVE,
                    rank,
                    coords,
                    confidence=0.9,
                    impact_pct=100.0,
                    summary=summary,
                    evidence=d,
                )
            )
    return out


def detect(run: RunContext, found: list[Finding]) -> tuple[list[Finding], list[str]]:
    """:func:`desync_findings` of the run's mismatched groups."""
    return desync_findings(run.data.mismatches, run.coords, run.data.usual), []


DETECTOR = Detector(Kind.DESYNC, Stage.FAULT, detect)
