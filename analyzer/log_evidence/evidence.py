"""One view of an imported job's ``log_events`` that every log detector reads: who was
there, how big the job is, and how sure that is.

World size is taken from what the lines say (``world_size=8``, NCCL's ``nranks``,
``fr_trace``'s expected ranks, torchrun's failed ranks), never from the number of files;
where nothing says it, the highest rank seen + 1 is a lower bound (``world_exact``
False) and ranks above it are unknown, not missing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pandas as pd

from ranksight.words import span

from ..findings import Finding

NAMED = ("timeout", "status", "present", "exception", "nccl_calls", "stack", "child_failed",
         "gpu_error", "mismatch", "nccl_warn", "nccl_info")  # fmt: skip
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

    def of(self, *kinds: str) -> pd.DataFrame:
        """The events of ``kinds``."""
        return self.frame[self.frame["kind"].isin(kinds)]

    def where(self, frame: pd.DataFrame, test) -> pd.DataFrame:
        """The rows of ``frame`` whose parsed ``detail`` passes ``test(detail)``."""
        return frame[[bool(test(d)) for d in frame["detail"]]] if len(frame) else frame

    def missing(self) -> list[int]:
        """Ranks of the world that left no line at all (below the lower bound only, where
        the world size is not said)."""
        if not self.world or self.world > 100_000:
            return []
        return sorted(set(range(self.world)) - self.present)

    def world_note(self) -> str:
        """How the world size is known, for a finding's text."""
        if not self.world:
            return "the world size is not in the lines"
        if self.world_exact:
            return f"world size {self.world} ({self.world_source})"
        return (
            f"world size at least {self.world} (the highest rank seen); ranks above "
            f"{self.world - 1} cannot be told apart from ranks that do not exist"
        )


def evidence_of(events: pd.DataFrame) -> Evidence:
    """:class:`Evidence` of a ``log_events`` frame (any subset of its columns' rows)."""
    frame = events.copy()
    frame["detail"] = [_loads(d) for d in frame.get("detail", pd.Series([], dtype=str))]
    named = frame[frame["kind"].isin(NAMED) & (frame["rank"] >= 0)]
    present = {int(r) for r in named["rank"]}
    ev = Evidence(frame, present)
    sizes = []
    for _, e in frame[frame["kind"] == "world"].iterrows():
        if int(e["code"]) > 0:
            sizes.append((int(e["code"]), str(e["detail"].get("source", "world size"))))
    for _, e in frame[frame["kind"] == "fr_missing"].iterrows():
        if int(e["code"]) > 0 and e["detail"].get("source") == "fr_trace":
            sizes.append((int(e["code"]), "fr_trace's expected ranks"))
    top = max(present, default=-1) + 1
    if sizes:
        n, src = max(sizes)
        ev.world, ev.world_exact, ev.world_source = max(n, top), n >= top, src
    else:
        ev.world = top
    return ev


def _loads(text) -> dict:
    try:
        d = json.loads(text) if isinstance(text, str) and text else {}
    except ValueError:
        return {}
    return d if isinstance(d, dict) else {}


def finding(kind: str, cause: str, rank: int, conf: float, summary: str, evidence: dict,
            coords: pd.DataFrame, host: str = "") -> Finding:  # fmt: skip
    """A log finding: mesh coordinates from ``coords`` where the rank has them (logs
    rarely say), ``impact_pct`` 100 (the job stopped), ``confidence`` rounded."""
    c = coords.loc[rank].to_dict() if rank >= 0 and rank in coords.index else {}
    return Finding(kind=kind, cause=cause, culprit_rank=int(rank),
                   host=host or str(c.get("host", "") or ""), dp=int(c.get("dp", -1)),
                   tp=int(c.get("tp", -1)), pp=int(c.get("pp", -1)),
                   confidence=round(float(conf), 2), impact_pct=100.0, summary=summary,
                   evidence=evidence)  # fmt: skip


def ranks_text(ranks) -> str:
    """``rank 3`` or ``ranks 0-5,7``."""
    rs = sorted(set(ranks))
    return f"rank {rs[0]}" if len(rs) == 1 else f"ranks {span(rs)}"
