"""What the analyzer concludes: frozen findings with evidence, confidence and impact."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

from ranksight.ground.mesh import MORE_AXES, MeshAxis
from ranksight.ground.vocab import NOT_FAULTS, Cause, Kind, cause_of, kind_of
from ranksight.ground.words import span

if TYPE_CHECKING:
    import pandas as pd

NO_COORDS: dict[str, Any] = {"dp": -1, "tp": -1, "pp": -1, "host": ""}
"""The coordinates of a rank the ``ranks`` table does not hold (-1 on each axis, no host)."""


def coords_at(coords: pd.DataFrame, rank: int) -> dict[str, Any]:
    """``rank``'s row of ``coords`` (indexed by rank; columns dp, tp, pp, host, ...) as a
    dict, or a copy of :data:`NO_COORDS` when the table has no such rank."""
    return coords.loc[rank].to_dict() if rank in coords.index else dict(NO_COORDS)


FINDING_AXES: tuple[str, ...] = tuple(a.value for a in (MeshAxis.DP, MeshAxis.TP, MeshAxis.PP))
"""The mesh axes every finding carries as fields, in the order summaries name them."""


def rank_place(rank: int, c: Mapping[str, Any] | pd.Series) -> str:
    """``rank R (dp=D, tp=T, pp=P, host H)``: a rank and its place, for summaries; ``c``:
    its coordinates (:func:`coords_at`, or a row of the ``ranks`` table), with any of
    :data:`ranksight.ground.mesh.MORE_AXES` it holds (``cp=1``) after pp."""
    more = [a for a in MORE_AXES if a in c and c[a] == c[a]]
    axes = ", ".join(f"{a}={int(c[a])}" for a in (*FINDING_AXES, *more))
    return f"rank {rank} ({axes}, host {c['host']})"


MORE_AXES_KEY = "mesh_axes"
"""Where a finding's :attr:`Finding.axes` (beyond dp, tp, pp) ride in the ``findings``
table's ``evidence_json``."""


def finding_at(kind: Kind, cause: Cause, rank: int, coords: pd.DataFrame, **kw: Any) -> Finding:
    """A finding naming ``rank`` at its coordinates in ``coords`` (:func:`coords_at`; a
    column of :data:`ranksight.ground.mesh.MORE_AXES`, where the table has one, goes in ``axes``);
    ``kw``: the other :class:`Finding` fields (confidence, impact_pct, summary, evidence)."""
    c = coords_at(coords, rank)
    more = {a: int(c[a]) for a in MORE_AXES if a in c and c[a] == c[a]}
    f = Finding(
        kind=kind,
        cause=cause,
        culprit_rank=int(rank),
        host=str(c["host"]),
        dp=int(c["dp"]),
        tp=int(c["tp"]),
        pp=int(c["pp"]),
        **kw,
    )
    return replace(f, axes=more) if more else f


@dataclass(frozen=True, slots=True)
class Finding:
    """One culprit (or problem) and why.

    ``impact_pct`` is how much faster the job would run without it: 25.0 means the mean
    step time would drop by 25%. ``confidence`` is in [0, 1]. ``evidence`` holds the
    numbers the finding rests on (times in ns unless a key says otherwise). ``kind`` and
    ``cause`` are words of :mod:`ranksight.ground.vocab`; a plain string is taken as its word,
    and an unknown one raises ValueError naming it. ``dp``, ``tp``, ``pp`` are the
    culprit's coordinates on the three axes every run has (-1: none); ``axes`` holds any
    further ones by axis name (``{"cp": 1, "ep": 3}``: context or expert parallel), and
    :meth:`coords` all of them.
    """

    kind: Kind
    cause: Cause
    culprit_rank: int
    host: str
    dp: int
    tp: int
    pp: int
    confidence: float
    impact_pct: float
    summary: str
    evidence: dict[str, Any] = field(default_factory=dict)
    axes: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", kind_of(self.kind))
        object.__setattr__(self, "cause", cause_of(self.cause))

    def coords(self) -> dict[str, int]:
        """The culprit's coordinate on every mesh axis the finding knows, by axis name:
        dp, tp, pp, then :attr:`axes`."""
        return {"dp": self.dp, "tp": self.tp, "pp": self.pp, **self.axes}

    def who(self) -> str:
        """Whom the finding names, for titles (never ``rank -1``): ``rank N``; ``stage N``
        for a pipeline stage; else its suspects, its slow group (``tp group of ranks
        2-3``), its host, or ``no single rank``."""
        if self.culprit_rank >= 0:
            return f"rank {self.culprit_rank}"
        if self.kind in NOT_FAULTS:
            return f"stage {self.pp}"
        if self.kind == Kind.TRANSIENT_STRAGGLER and self.evidence.get("ranks"):
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
        if row.pop("axes"):  # the findings table has dp, tp, pp columns; others ride along
            evidence = {**evidence, MORE_AXES_KEY: dict(self.axes)}
        row["kind"], row["cause"] = self.kind.value, self.cause.value
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
        names = [f for f in cls.__dataclass_fields__ if f not in ("evidence", "axes")]
        kw = {n: row[n] for n in names}
        for n in ("culprit_rank", "dp", "tp", "pp"):
            kw[n] = int(kw[n])
        kw["confidence"], kw["impact_pct"] = float(kw["confidence"]), float(kw["impact_pct"])
        evidence = json.loads(row.get("evidence_json") or "{}")
        axes = evidence.pop(MORE_AXES_KEY, None) if isinstance(evidence, dict) else None
        axes = {str(a): int(c) for a, c in axes.items()} if isinstance(axes, dict) else {}
        return cls(**kw, evidence=evidence, axes=axes)


def _json_default(o: Any) -> Any:
    if hasattr(o, "item"):  # numpy scalars
        return o.item()
    if hasattr(o, "tolist"):
        return o.tolist()
    return str(o)
