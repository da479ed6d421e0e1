"""Where a finding starts, in steps: a straggler's onset step as the analyzer found it;
for a hang or a crash (the analyzer's hang findings carry no step) the step the culprit
never finished, one past the last step it recorded."""

from __future__ import annotations

from ranksight.analyzer import Finding
from ranksight.ground.vocab import Kind
from ranksight.store import Store

from .run import RUN, RunView

LAST_STEPS = f"SELECT rank, max(step) AS last FROM steps WHERE {RUN} GROUP BY rank"

STOPPED = {Kind.HANG: "hung in this step", Kind.CRASH: "crashed in this step"}
"""Finding kinds that mark where progress stopped rather than where a slowdown began,
and what their mark on the overview says."""


def last_steps(store: Store, run: RunView) -> dict[int, int]:
    """rank -> the last step it recorded (ranks with no step rows left out). Raises
    StoreError."""
    got = store.query(LAST_STEPS, run.params)
    return dict(zip(got["rank"].astype(int), got["last"].astype(int), strict=True))


def finding_step(f: Finding, last: dict[int, int]) -> int | None:
    """The step finding ``f`` starts at: its ``onset_step``; for a hang or crash the
    step its culprit never finished (with no culprit, the first step some rank never
    finished); None when neither is known (``last``: :func:`last_steps`)."""
    if "onset_step" in f.evidence:
        return int(f.evidence["onset_step"])
    if f.kind not in STOPPED or not last:
        return None
    if f.culprit_rank >= 0:
        return last[f.culprit_rank] + 1 if f.culprit_rank in last else None
    return min(last.values()) + 1


def onset_marks(findings: tuple[Finding, ...], last: dict[int, int]) -> list[tuple[int, str]]:
    """(step, label) of each finding that names a rank and has a step
    (:func:`finding_step`): "rank 5 slow from here", "rank 3 hung in this step"."""
    out = []
    for f in findings:
        step = finding_step(f, last)
        if step is None or f.culprit_rank < 0:
            continue
        out.append((step, f"rank {f.culprit_rank} {STOPPED.get(f.kind, 'slow from here')}"))
    return out
