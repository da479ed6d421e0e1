"""What an imported job's text logs and stacks say, read as an expert reads them:
pure functions over the ``log_events`` table (``ranksight/importer/logs`` writes it).

Each detector is one module with ``detect(evidence, coords) -> (findings, notes)``,
registered in :data:`DETECTORS`. :func:`log_findings` runs them and orders what they
found: the cause before its consequences (a GPU error or a desync before the hang it
caused), then by confidence. Every finding carries ``evidence["suspects"]`` (global
ranks, possibly empty) and stays below 0.7 confidence unless the lines decide it.
"""

from __future__ import annotations

import dataclasses

import pandas as pd

from ranksight.ground.vocab import Kind

from . import calls, crash, desync, hang, hardware, reported, stacks, startup
from .evidence import Evidence, evidence_of, finding, ranks_text

DETECTORS = (hardware, desync, crash, reported, hang, calls, stacks, startup)
"""Every log detector, each a module with ``detect``."""

ORDER = (Kind.HARDWARE, Kind.NETWORK, Kind.DESYNC, Kind.CRASH, Kind.HANG)
"""Finding kinds, cause first: the report's first finding is the one to act on."""


def log_findings(events: pd.DataFrame, coords: pd.DataFrame) -> tuple[list, list[str]]:
    """(findings, notes) of a ``log_events`` frame; ``coords``: rank -> dp, tp, pp, host."""
    if events.empty:
        return [], []
    ev = evidence_of(events)
    findings, notes = [], []
    for d in DETECTORS:
        f, n = d.detect(ev, coords)
        findings += f
        notes += n
    if missing := ev.missing():
        notes.append(f"no line from {ranks_text(missing)}. {ev.world_note()}")
    findings = _inferred(findings, ev.mapped_only()) or _unplaced(ev, coords)
    return _fold(sorted(findings, key=_rank), notes), notes


UNPLACED = (
    ("desync", ("mismatch", "desync_report")),
    ("hardware", ("gpu_error",)),
    ("network", ("nccl_warn",)),
    (
        "crash",
        ("child_failed", "fatal_signal", "exception", "peer_gone", "nccl_error", "worker_died"),
    ),
    ("hang", ("timeout", "status", "watchdog_stuck", "fr_missing", "init_failure")),
)
"""Finding kind of lines that show a failure no detector placed (never "healthy")."""


def _unplaced(ev: Evidence, coords) -> list:
    """A weak finding for lines that show a failure no detector could place, so that a
    failed job is never reported as healthy."""
    for kind, kinds in UNPLACED:
        rows = ev.of(*kinds)
        rows = ev.where(rows, lambda d: d.get("category") != "benign")  # no failure (is_fault)
        if not rows.empty:
            e = rows.iloc[0]
            return [finding(kind, "unknown", -1, 0.2,
                            f"{kind}: the lines show a failure ({int(rows['count'].sum())} such "
                            f"lines, e.g. {str(e['text'])[:160]!r}) that they do not place on a "
                            "rank, a group or a host", {"suspects": []}, coords)]  # fmt: skip
    return []


INFERRED_CAP = 0.65
"""Highest confidence in a rank whose global number the lines never state (inferred)."""


def _inferred(findings: list, inferred: set[int]) -> list:
    """Findings naming a rank known only by inference, capped at :data:`INFERRED_CAP`."""
    return [
        dataclasses.replace(f, confidence=min(f.confidence, INFERRED_CAP),
                            evidence={**f.evidence, "rank_inferred": True})
        if f.culprit_rank in inferred and f.confidence > INFERRED_CAP else f
        for f in findings
    ]  # fmt: skip


FOLD_CONFIDENCE = 0.45
"""A cause this sure takes in the hang it explains (the hang names no rank of its own)."""


SILENCE_EXPLAINED = (Kind.CRASH, Kind.DESYNC)
"""Causes that explain a hang naming a rank only for its silence: a rank's own crash
(FunASR#2006), and a desync whose unseen side that silent rank is (pytorch#20630)."""


def _fold(findings: list, notes: list[str]) -> list:
    """The hang a desync, a hardware error or a crash explains goes into its evidence (as
    ``analyzer/diagnose.py`` folds a live hang into its desync): a hang that names no rank,
    or, beside a crash, one that names a rank only for its silence (:func:`_by_silence`)."""
    cause = next((f for f in findings if f.kind in (Kind.DESYNC, Kind.HARDWARE, Kind.NETWORK, Kind.CRASH)
                  and f.confidence >= FOLD_CONFIDENCE), None)  # fmt: skip
    if cause is None:
        return findings
    hangs = [f for f in findings if f.kind == Kind.HANG
             and (f.culprit_rank < 0 or cause.kind in SILENCE_EXPLAINED and _by_silence(f))]  # fmt: skip
    if not hangs:
        return findings
    out = []
    for f in findings:
        if f is cause:
            f = dataclasses.replace(f, evidence={**f.evidence, "hang": [h.summary for h in hangs]})
        if f not in hangs:
            out.append(f)
    notes.append(f"the hang is the {cause.kind}'s consequence: {hangs[0].summary}")
    return out


def _by_silence(hang) -> bool:
    """Whether ``hang`` names its rank only because it left no line or no timeout (its
    ``silent`` / ``no_timeout`` evidence), not from where it stands: beside a rank's own
    crash that silence is the crash's consequence, no cause of its own (FunASR#2006:
    rank 2's OOM; the others time out; rank 1 was named for saying nothing)."""
    quiet = [r for k in ("silent", "no_timeout") if isinstance(v := hang.evidence.get(k), list)
             for r in v]  # fmt: skip
    return hang.culprit_rank in quiet


def _rank(f) -> tuple:
    weak = f.confidence < 0.35  # a weak cause does not lead a strong consequence
    order = ORDER.index(f.kind) if f.kind in ORDER else len(ORDER)
    return (weak, order, -f.confidence)


__all__ = ["DETECTORS", "Evidence", "evidence_of", "log_findings"]
