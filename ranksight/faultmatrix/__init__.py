"""The fault matrix: every fault the reference trainer can inject, and how the analyzer is
scored against its ground truth.

Each :class:`Scenario` is one real training job (8 CPU ranks, DP2 x TP2 x PP2, gloo) with
one fault, or none. The trainer records the fault it injected (kind, rank, mesh
coordinates, step, parameters) in the run's ``meta_json``; :func:`expectation` turns that
record into the finding the analyzer should make, and :func:`score` compares the
analyzer's findings with it.

Expected findings per fault kind (:data:`EXPECTED`; ``None`` cause: any cause, the kind
says it all):

==============  ====================  ==============  =====================================
fault           finding kind          cause           culprit
==============  ====================  ==============  =====================================
slow            straggler             compute         the rank
slow_link       slow_communication    communication   a member of the slow group (tp, dp),
                                                      or the rank or a pipeline neighbour it
                                                      sends to (pp); or no rank (-1) with the
                                                      group's ranks in the evidence
hang            hang                  any             the rank
crash           crash                 any             the rank
desync          desync                any             the rank
data_stall      straggler             data_loader     the rank
cpu_contention  straggler             cpu_contention  the rank
gc_storm        straggler             gc              the rank
nan             nan                   any             the rank
gc_pauses       transient_straggler   gc              no single rank (-1): each pause is on
                                                      another rank
slow_turns      transient_straggler   compute         no single rank (-1): each slow step is
                                                      on another rank
none            (no finding)
==============  ====================  ==============  =====================================

A job whose design is uneven, not faulty (:data:`DESIGN_EXPECTED`): a clean run whose
trainer config holds an uneven ``--layer-split`` expects ``pipeline_imbalance`` /
``stage_imbalance`` on no single rank (-1), at the stage that holds the most blocks. A
scenario may also ask for the impact's method (``impact_method``, e.g. ``before/after``
for a fault that starts late: the steps before its onset are the measured baseline).

Verdicts: ``right`` (a finding matches, and no other finding names a rank outside the
culprit set), ``MISSED`` (no finding matches and none names a culprit), ``WRONG`` (a
finding names a culprit rank with another kind or cause), ``FALSE`` (a clean run with
findings, or a right row with false findings beside it). Only ``right`` passes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ranksight.ground.mesh import coords_of, rank_of
from ranksight.ground.vocab import NOT_FAULTS

SHAPE = {"dp": 2, "tp": 2, "pp": 2}
"""The matrix's mesh: 8 CPU ranks."""

EXPECTED: dict[str, tuple[str, str | None]] = {
    "slow": ("straggler", "compute"),
    "slow_link": ("slow_communication", "communication"),
    "hang": ("hang", None),
    "crash": ("crash", None),
    "desync": ("desync", None),
    "data_stall": ("straggler", "data_loader"),
    "cpu_contention": ("straggler", "cpu_contention"),
    "gc_storm": ("straggler", "gc"),
    "nan": ("nan", None),
    "gc_pauses": ("transient_straggler", "gc"),
    "slow_turns": ("transient_straggler", "compute"),
}
"""Fault kind -> (finding kind, cause or None for any)."""

DESIGN_EXPECTED: tuple[str, str] = ("pipeline_imbalance", "stage_imbalance")
"""(finding kind, cause) of a clean run whose pipeline stages hold uneven block counts."""


@dataclass(frozen=True, slots=True)
class Scenario:
    """One job of the matrix."""

    name: str
    inject: str
    """Fault spec for the trainer, ``none`` for a clean run."""
    steps: int = 14
    """Training steps."""
    quick: bool = False
    """Part of the CI subset (``--quick``)."""
    layer_split: tuple[int, ...] | None = None
    """Blocks per pipeline stage (the trainer's ``--layers`` is their sum); None: even."""
    impact_method: str | None = None
    """The ``impact_method`` a right finding's evidence must give (None: any)."""

    @property
    def trainer_args(self) -> list[str]:
        """Trainer flags beyond the mesh, steps and fault (``--layers 4 --layer-split 3,1``)."""
        if self.layer_split is None:
            return []
        split = ",".join(map(str, self.layer_split))
        return ["--layers", str(sum(self.layer_split)), "--layer-split", split]


SCENARIOS: tuple[Scenario, ...] = (
    Scenario("clean-a", "none", quick=True),
    Scenario("clean-b", "none"),
    Scenario("slow", "slow:rank=5,factor=3,from_step=4", quick=True),
    Scenario("slow_link-tp", "slow_link:rank=2,delay_ms=20,group=tp,from_step=4"),
    Scenario("slow_link-dp", "slow_link:rank=1,delay_ms=200,group=dp,from_step=4"),
    Scenario("slow_link-pp", "slow_link:rank=2,delay_ms=100,group=pp,from_step=4"),
    Scenario("hang", "hang:rank=3,from_step=5"),
    Scenario("crash", "crash:rank=6,from_step=5", quick=True),
    Scenario("desync-skip", "desync:rank=7,mode=skip,from_step=5"),
    Scenario("desync-resize", "desync:rank=4,mode=resize,from_step=5"),
    Scenario("data_stall", "data_stall:rank=3,delay_ms=400,from_step=4"),
    Scenario("cpu_contention", "cpu_contention:rank=4,procs=3,from_step=4"),
    Scenario("gc_storm", "gc_storm:rank=2,from_step=4"),
    Scenario("nan", "nan:rank=7,from_step=6"),
    Scenario("gc_pauses", "gc_pauses:delay_ms=2500,every=3,from_step=4"),
    Scenario("slow_turns", "slow_turns:factor=4,every=2,from_step=4", steps=20),
    Scenario("slow-late", "slow:rank=5,factor=3,from_step=12", steps=20,
             impact_method="before/after"),
    Scenario("uneven_split", "none", layer_split=(3, 1)),
)  # fmt: skip
"""Every scenario, clean runs first."""


def pick(names: str | None = None, quick: bool = False) -> list[Scenario]:
    """Scenarios by comma-separated ``names`` (all when None), or the quick subset.
    Raises ValueError naming unknown scenarios and listing the known ones."""
    if quick:
        return [s for s in SCENARIOS if s.quick]
    if not names:
        return list(SCENARIOS)
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    known = {s.name: s for s in SCENARIOS}
    unknown = [n for n in wanted if n not in known]
    if unknown:
        raise ValueError(f"unknown scenarios {unknown}; known: {', '.join(known)}")
    return [known[n] for n in wanted]


@dataclass(frozen=True, slots=True)
class Expectation:
    """The finding a scenario should produce (``kind`` None: none at all)."""

    kind: str | None
    cause: str | None
    """None: any cause."""
    culprits: frozenset[int]
    """Ranks a right finding may name."""
    from_step: int = 0
    group: str = ""
    """Comma-separated ranks of a slow group (slow_link), for findings that name no rank."""
    stage: int | None = None
    """The pipeline stage a right finding names (its ``pp``); None: any."""
    impact_method: str | None = None
    """The ``impact_method`` a right finding's evidence gives; None: any."""

    @property
    def label(self) -> str:
        """E.g. ``straggler/compute @ 5``, ``hang @ 3``, ``(none)``,
        ``pipeline_imbalance/stage_imbalance @ stage 0``."""
        if self.kind is None:
            return "(none)"
        what = self.kind + (f"/{self.cause}" if self.cause else "")
        where = f"stage {self.stage}" if self.stage is not None else None
        where = where or ",".join(map(str, sorted(self.culprits)))
        how = f" ({self.impact_method} impact)" if self.impact_method else ""
        return f"{what} @ {where}{how}"


def _link_culprits(fault: Mapping[str, Any], shape: Mapping[str, int]) -> list[int]:
    c, axis = coords_of(int(fault["rank"]), shape), fault.get("group") or "tp"
    if axis != "pp":
        return [rank_of({**c, axis: i}, shape) for i in range(shape[axis])]
    near = [c["pp"] + d for d in (-1, 1) if 0 <= c["pp"] + d < shape["pp"]]
    return [int(fault["rank"])] + [rank_of({**c, "pp": p}, shape) for p in near]


def expectation(
    faults: Sequence[Mapping[str, Any]],
    shape: Mapping[str, int],
    *,
    layer_split: Sequence[int] | None = None,
    impact_method: str | None = None,
) -> Expectation:
    """The expected finding for a run's fault ground truth (``meta_json["faults"]``, as
    :func:`~ranksight.reference_trainer.faults.faults_ground_truth` writes it) and its
    trainer's ``layer_split`` (``meta_json["config"]["parallel"]``): no fault and an even
    split -> no finding; no fault and an uneven split -> :data:`DESIGN_EXPECTED`.
    ``impact_method``: what a right finding's impact must rest on. Raises ValueError for
    more than one fault, an unknown kind, or a fault on an uneven split."""
    uneven = layer_split is not None and len(set(layer_split)) > 1
    if uneven and faults:
        raise ValueError("the matrix scores a fault on an evenly split pipeline only")
    if uneven and layer_split is not None:
        most = max(layer_split)
        heavy = [s for s, n in enumerate(layer_split) if n == most]
        stage = heavy[0] if len(heavy) == 1 else None
        return Expectation(
            *DESIGN_EXPECTED, frozenset({-1}), stage=stage, impact_method=impact_method
        )
    if not faults:
        return Expectation(kind=None, cause=None, culprits=frozenset())
    if len(faults) > 1:
        raise ValueError(f"the matrix scores one fault per run, got {len(faults)}")
    fault = faults[0]
    if fault["kind"] not in EXPECTED:
        raise ValueError(f"no expected finding for fault kind {fault['kind']!r}")
    kind, cause = EXPECTED[fault["kind"]]
    ranks = (
        _link_culprits(fault, shape)
        if fault["kind"] == "slow_link"
        else [-1]
        if fault.get("rank") is None  # a fault on every rank in turn names none
        else [fault["rank"]]
    )
    group = ",".join(map(str, sorted(ranks))) if fault["kind"] == "slow_link" else ""
    culprits = frozenset(int(r) for r in ranks)
    return Expectation(
        kind, cause, culprits, int(fault["from_step"]), group, impact_method=impact_method
    )


def _names_group(finding: Mapping[str, Any], e: Expectation) -> bool:
    text = json.dumps(finding.get("evidence", {}), default=str)
    members = e.group.split(",")
    return bool(e.group) and (e.group in text or f"[{', '.join(members)}]" in text)


def matches(finding: Mapping[str, Any], e: Expectation) -> bool:
    """Whether ``finding`` (a Finding as a dict) is the expected one."""
    if e.kind is None or finding["kind"] != e.kind:
        return False
    if e.cause is not None and finding["cause"] != e.cause:
        return False
    if e.stage is not None and int(finding.get("pp", -1)) != e.stage:
        return False
    evidence = finding.get("evidence") or {}
    if e.impact_method is not None and evidence.get("impact_method") != e.impact_method:
        return False
    rank = int(finding["culprit_rank"])
    return rank in e.culprits or (rank < 0 and _names_group(finding, e))


def finding_label(finding: Mapping[str, Any]) -> str:
    """``kind/cause @ rank`` of a finding."""
    return f"{finding['kind']}/{finding['cause']} @ {finding['culprit_rank']}"


@dataclass(frozen=True, slots=True)
class Score:
    """How the analyzer did on one run."""

    verdict: str
    """``right``, ``MISSED``, ``WRONG`` or ``FALSE``."""
    found: str
    """The matching finding's label, else the top finding's, else ``(none)``."""
    false_findings: tuple[str, ...]
    """Labels of findings that name a rank outside the culprit set (all, on a clean run)."""

    @property
    def passed(self) -> bool:
        """Only ``right`` passes."""
        return self.verdict == "right"


def score(findings: Sequence[Mapping[str, Any]], e: Expectation) -> Score:
    """Score ``findings`` (dicts with kind, cause, culprit_rank, evidence) against ``e``.
    Findings that describe the job's design, not a fault (``pipeline_imbalance``), are
    not scored, unless the design is what ``e`` expects (an uneven layer split)."""
    findings = [f for f in findings if f["kind"] not in NOT_FAULTS or f["kind"] == e.kind]
    if e.kind is None:
        false = tuple(finding_label(f) for f in findings)
        return Score("FALSE" if false else "right", false[0] if false else "(none)", false)
    hit = [f for f in findings if matches(f, e)]
    near = [f for f in findings if not matches(f, e) and int(f["culprit_rank"]) in e.culprits]
    false = tuple(
        finding_label(f) for f in findings
        if not matches(f, e) and int(f["culprit_rank"]) not in e.culprits
    )  # fmt: skip
    if hit:
        return Score("FALSE" if false else "right", finding_label(hit[0]), false)
    if near:
        return Score("WRONG", finding_label(near[0]), false)
    return Score("MISSED", finding_label(findings[0]) if findings else "(none)", false)
