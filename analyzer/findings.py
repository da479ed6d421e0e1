"""What the analyzer concludes: frozen findings with evidence, confidence and impact."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from ranksight.words import span

if TYPE_CHECKING:
    import pandas as pd

KINDS = ("straggler", "slow_communication", "hang", "crash", "desync", "nan", "pipeline_imbalance",
         "hardware", "network", "transient_straggler")  # fmt: skip
CAUSES = ("compute", "data_loader", "optimizer", "communication", "unknown", "gc", "cpu_contention",
          "gpu_throttle", "gpu_contention", "stage_imbalance", "data_imbalance",
          # what a job's logs say (analyzer/log_evidence)
          "stuck", "stopped_completing", "watchdog_abort", "watchdog_stuck", "rendezvous",
          "lagging", "mismatch", "ahead", "signal", "exit_code", "exception", "nccl_error",
          "gpu_error", "cuda_error", "pcie", "network", "peer_gone", "unreachable", "checkpoint")  # fmt: skip
NOT_FAULTS = ("pipeline_imbalance",)
"""Finding kinds that name no failing rank: the job's own split of the work (its severity
follows its measured cost, ``imbalance.SEVERITY``)."""

NO_COORDS: dict[str, Any] = {"dp": -1, "tp": -1, "pp": -1, "host": ""}
"""The coordinates of a rank the ``ranks`` table does not hold (-1 on each axis, no host)."""


def coords_at(coords: pd.DataFrame, rank: int) -> dict[str, Any]:
    """``rank``'s row of ``coords`` (indexed by rank; columns dp, tp, pp, host, ...) as a
    dict, or a copy of :data:`NO_COORDS` when the table has no such rank."""
    return coords.loc[rank].to_dict() if rank in coords.index else dict(NO_COORDS)


@dataclass(frozen=True, slots=True)
class Finding:
    """One culprit (or problem) and why.

    ``impact_pct`` is how much faster the job would run without it: 25.0 means the mean
    step time would drop by 25%. ``confidence`` is in [0, 1]. ``evidence`` holds the
    numbers the finding rests on (times in ns unless a key says otherwise).
    """

    kind: str
    cause: str
    culprit_rank: int
    host: str
    dp: int
    tp: int
    pp: int
    confidence: float
    impact_pct: float
    summary: str
    evidence: dict[str, Any] = field(default_factory=dict)

    def who(self) -> str:
        """Whom the finding names, for titles (never ``rank -1``): ``rank N``; ``stage N``
        for a pipeline stage; else its suspects, its slow group (``tp group of ranks
        2-3``), its host, or ``no single rank``."""
        if self.culprit_rank >= 0:
            return f"rank {self.culprit_rank}"
        if self.kind in NOT_FAULTS:
            return f"stage {self.pp}"
        if self.kind == "transient_straggler" and self.evidence.get("ranks"):
            return f"ranks {span(self.evidence['ranks'])} in turn"
        suspects = self.evidence.get("suspects") or []
        if suspects and isinstance(suspects, list):
            return f"suspects {span(suspects)}"
        groups = self.evidence.get("slow_groups") or []
        if groups and isinstance(groups, list) and isinstance(groups[0], dict):
            g, more = groups[0], f" and {len(groups) - 1} more" if len(groups) > 1 else ""
            return f"{g.get('axis', '')} group of ranks {span(g.get('members') or [])}{more}"
        return f"host {self.host}" if self.host else "no single rank"

    def to_row(self, run_id: str, attempt: int, analyzed_ns: int, finding_id: int) -> dict:
        """The ``findings`` table row for this finding."""
        row = asdict(self)
        evidence = row.pop("evidence")
        return {
            "run_id": run_id,
            "attempt": attempt,
            "analyzed_ns": analyzed_ns,
            "finding_id": finding_id,
            **row,
            "evidence_json": json.dumps(evidence, default=_json_default),
        }

    @classmethod
    def from_row(cls, row: dict) -> Finding:
        """Inverse of :meth:`to_row` (ignores run_id, attempt, analyzed_ns, finding_id)."""
        names = [f for f in cls.__dataclass_fields__ if f != "evidence"]
        kw = {n: row[n] for n in names}
        for n in ("culprit_rank", "dp", "tp", "pp"):
            kw[n] = int(kw[n])
        kw["confidence"], kw["impact_pct"] = float(kw["confidence"]), float(kw["impact_pct"])
        return cls(**kw, evidence=json.loads(row.get("evidence_json") or "{}"))


def _json_default(o: Any) -> Any:
    if hasattr(o, "item"):  # numpy scalars
        return o.item()
    if hasattr(o, "tolist"):
        return o.tolist()
    return str(o)
