"""The detector seam: what every finding kind's module provides, and the run it reads.

A detector is one module of this package holding the query it needs (or naming the
``RunData`` frame it reads), what it detects, and the finding it builds. It exports one
:class:`Detector`; ``analyzer/registry.py`` lists them in order and
``analyzer/diagnose.py`` runs the list, then folds the results (victims, a hang or crash
into the desync that explains it, the stop before milder slowness).

Each detector sees a :class:`RunContext` (the run's frames and what several detectors
share, computed once) and the findings of the detectors before it.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

import pandas as pd

from ranksight.ground.mesh import MORE_AXES
from ranksight.ground.vocab import Kind

from ..findings import Finding
from ..groups import group_axes
from ..impact import step_times
from ..imported import is_imported
from ..straggler import SlowRank, StragglerConfig, find_slow_ranks

if TYPE_CHECKING:
    from ..queries import RunData

_MS = 1e6


class Stage(enum.Enum):
    """When a detector runs, and what happens to its findings after."""

    FAULT = 1
    """Faults that cost step time: their impacts are checked against the measured step and
    composed (``analyzer/impact.py: checked_impacts``), then ordered by impact."""
    DESIGN = 2
    """The job's own design (its stage split): after the faults, never composed with them."""
    STOP = 3
    """What stopped the job or stalled it (crash, hang): folded into a desync that explains
    it, else first (``analyzer/folds.py``)."""


Detect = Callable[["RunContext", list[Finding]], tuple[list[Finding], list[str]]]
"""(run, findings so far) -> (new findings, notes)."""
Fold = Callable[[list[Finding], list[Finding]], tuple[list[Finding], list[str]]]
"""(findings so far, a detector's findings) -> (findings, notes)."""


@dataclass(frozen=True)
class Detector:
    """One finding kind's detector: ``detect`` as :data:`Detect`."""

    kind: Kind
    stage: Stage
    detect: Detect
    hooked_only: bool = False
    """Skipped for runs made by ``ranksight import`` (no live step records of that kind)."""
    imported_only: bool = False
    """Run only for imported runs (snapshots of a job after the fact)."""
    fold: Fold | None = None
    """How its findings join the others (``analyzer/folds.py``); None: after them."""


@dataclass
class RunContext:
    """One run's frames (``data``) and the values several detectors need, each computed
    once on first use. ``cfg``: the straggler thresholds (also the steps skipped)."""

    data: RunData
    cfg: StragglerConfig = field(default_factory=StragglerConfig)

    memo: dict[str, Any] = field(default_factory=dict)
    """Values a detector computes once for the detectors after it (:meth:`once`)."""

    def once(self, key: str, compute: Callable[[], Any]) -> Any:
        """``compute()``, computed on the first call for ``key`` and kept."""
        if key not in self.memo:
            self.memo[key] = compute()
        return self.memo[key]

    @cached_property
    def imported(self) -> bool:
        """True for a run written by ``ranksight import``."""
        return is_imported(self.data.run)

    @cached_property
    def coords(self) -> pd.DataFrame:
        """rank -> dp, tp, pp, host (the ``ranks`` table, indexed by rank), and any
        further mesh axis it has (``ranksight.ground.mesh.MORE_AXES``)."""
        cols = ["dp", "tp", "pp", "host"]
        if self.data.ranks.empty:
            return pd.DataFrame(columns=cols)
        more = [a for a in MORE_AXES if a in self.data.ranks.columns]
        return self.data.ranks.set_index("rank")[cols + more]

    @cached_property
    def step_ns(self) -> pd.Series:
        """step -> the median rank's step duration (ns), every recorded step."""
        return step_times(self.data.steps)

    @cached_property
    def analyzed(self) -> pd.Series:
        """:attr:`step_ns` of the analyzed steps (the first ``cfg.skip_steps`` left out)."""
        return self.step_ns.sort_index().iloc[self.cfg.skip_steps :]

    @cached_property
    def steps_in(self) -> list[int]:
        """The analyzed steps' numbers."""
        return [int(x) for x in self.analyzed.index]

    @cached_property
    def median_step_ms(self) -> float:
        """Median of :attr:`analyzed` (ms); 0 with no step."""
        return float(self.analyzed.median()) / _MS if not self.analyzed.empty else 0.0

    @cached_property
    def axes(self) -> dict[str, str]:
        """group_id -> mesh axis of the group (``analyzer/groups.py``)."""
        return group_axes(self.data.groups, self.coords) if not self.data.groups.empty else {}

    @cached_property
    def totals(self) -> pd.DataFrame:
        """Per (rank, step) self times (``queries.PHASE_TOTALS``), else the phase rows."""
        d = self.data
        return d.phase_totals if not d.phase_totals.empty else d.phases

    @cached_property
    def slow(self) -> list[SlowRank]:
        """Every rank slower than its same-stage peers (``analyzer/straggler.py``), victims
        included: what the straggler detector judges and the transient one leaves out.
        Only steps with a step record count: phases after the last one (a data wait
        begun as the loop ended) are no step and would read as a fast one."""
        totals = self.totals
        if not totals.empty and not self.step_ns.empty:
            totals = totals[totals["step"].isin(self.step_ns.index)]
        return find_slow_ranks(totals, self.coords["pp"], self.step_ns, self.cfg)


def of_kind(findings: list[Finding], kind: Kind) -> list[Finding]:
    """The findings of one kind."""
    return [f for f in findings if f.kind == kind]
