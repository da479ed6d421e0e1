"""How findings combine after the detectors ran (``analyzer/diagnose.py``).

- A fault or design finding is added after the others (:func:`append`).
- A crash or hang is the consequence of a desync that explains it, kept in that finding's
  evidence (:func:`with_crash`, :func:`with_hang`); else it leads (:func:`prepend`).
- Beside a stop, milder slowness in the few steps before it is a note
  (:func:`beside_the_stop`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from ranksight.ground.vocab import Kind

from .detectors.desync import issued_after
from .findings import Finding


def append(findings: list[Finding], new: list[Finding]) -> tuple[list[Finding], list[str]]:
    """``new`` after ``findings``."""
    return findings + new, []


def prepend(findings: list[Finding], new: list[Finding]) -> tuple[list[Finding], list[str]]:
    """``new`` before ``findings`` (a stop leads the report)."""
    return new + findings, []


def each_crash(findings: list[Finding], new: list[Finding]) -> tuple[list[Finding], list[str]]:
    """Each of ``new`` folded by :func:`with_crash`."""
    notes: list[str] = []
    for crash in new:
        findings, more = with_crash(findings, crash)
        notes += more
    return findings, notes


def each_hang(findings: list[Finding], new: list[Finding]) -> tuple[list[Finding], list[str]]:
    """Each of ``new`` folded by :func:`with_hang`."""
    for hang in new:
        findings = with_hang(findings, hang)
    return findings, []


MIN_RATIO_BESIDE_STOP = 2.0
"""Beside a finding that stopped the job (hang, crash, desync), a straggler is named only
this much slower than its peers; a milder slowdown in the few steps before the stop is
noted instead."""


def beside_the_stop(findings: list[Finding], notes: list[str]) -> list[Finding]:
    """Keep the stop and the stragglers that stand out even in a run cut short."""
    kept = []
    for f in findings:
        if f.kind == Kind.TRANSIENT_STRAGGLER:
            notes.append(f"before the job stopped: {f.summary} (not named beside the stop)")
            continue
        ratio = float(f.evidence.get("median_ratio", 0) or 0) if f.kind == Kind.STRAGGLER else 0.0
        if f.kind == Kind.STRAGGLER and ratio < MIN_RATIO_BESIDE_STOP:
            notes.append(
                f"rank {f.culprit_rank} was {ratio:.2f}x its peers ({f.cause}) in the steps "
                "before the job stopped: not named beside the stop"
            )
            continue
        kept.append(f)
    return kept


def _fold_into_desync(
    findings: list[Finding],
    event: Finding,
    explains: Callable[[Finding], bool],
    key: str,
    evidence: dict,
    then: str,
) -> list[Finding]:
    """``event`` (a crash or hang) first in ``findings``, unless a desync finding it
    ``explains`` is there: then it is that finding's consequence, kept in its evidence
    under ``key`` and said after its summary (``; then``)."""
    for i, f in enumerate(findings):
        if f.kind == Kind.DESYNC and explains(f):
            findings[i] = replace(
                f, evidence={**f.evidence, key: evidence}, summary=f"{f.summary}; {then}"
            )
            return findings
    return [event, *findings]


def _took_part(desync: dict, rank: int) -> bool:
    """Whether ``rank`` issued the collective at ``desync``'s sequence itself (it has a
    signature there). Then the mismatch met it alive, inside that collective: its death
    (gloo aborts on a size mismatch) follows the desync, whatever its recorded end says.
    That end is the last moment it was seen, no later than its last record: in the fault
    matrix's desync-resize run rank 5's end was its own enqueue of #282, 22 ms before
    rank 4 issued the resized #282 that aborted it."""
    return any(int(r) == rank for r in (desync.get("signatures") or {}))


def with_crash(findings: list[Finding], crash: Finding) -> tuple[list[Finding], list[str]]:
    """Add the crash finding first, unless a desync explains it: a rank that died inside
    a collective its group's members issued differently (gloo aborts on a size mismatch)
    is a consequence, kept as the desync finding's evidence. A desync the dead rank did
    not take part in (not an odd rank, and no collective of its own at that sequence), at
    a sequence some other member issued after the death
    (:func:`analyzer.detectors.desync.issued_after`), is the survivors' error handling: it
    becomes a note and the crash leads. Returns (findings, notes)."""
    rank, died = int(crash.culprit_rank), int(crash.evidence.get("ended_ns", 0))
    notes, kept = [], []
    for f in findings:
        late = (
            issued_after(f.evidence, rank, died)
            if f.kind == Kind.DESYNC
            and died > 0
            and rank not in f.evidence.get("odd_ranks", [])
            and not _took_part(f.evidence, rank)
            else []
        )
        if not late:
            kept.append(f)
            continue
        notes.append(
            f"after rank {rank} ended, rank(s) {', '.join(map(str, late))} issued "
            f"{f.evidence.get('group_id')} #{f.evidence.get('seq')} and its members' "
            "collectives there differ: the survivors' error handling, not taken as a desync"
        )
    how = crash.evidence.get("detail") or crash.cause
    folded = _fold_into_desync(
        kept,
        crash,
        lambda f: (
            crash.culprit_rank
            in [int(m) for m in str(f.evidence.get("members", "")).split(",") if m]
        ),
        "then_crashed",
        {"rank": crash.culprit_rank, **crash.evidence},
        f"then rank {crash.culprit_rank}'s process ended ({how})",
    )
    return folded, notes


def with_hang(findings: list[Finding], hang: Finding) -> list[Finding]:
    """Add the hang finding first, unless a desync explains it: ranks that issued
    different collectives at one sequence number wait for each other forever, so a hang
    with no root outside the desync (every rank blocked, or the root is the desync's odd
    rank) is its consequence, kept as the desync finding's evidence."""
    stalled = hang.evidence.get("stalled_s", 0)
    return _fold_into_desync(
        findings,
        hang,
        lambda f: hang.culprit_rank in (-1, f.culprit_rank),
        "then_hung",
        hang.evidence,
        f"the job then hung ({stalled:.0f} s without a step)",
    )
