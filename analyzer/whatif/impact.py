"""Straggler impact from a what-if replay: a bounded slice replay on hooked runs
(``whatif/slice.py``, :func:`straggler_impacts`) and a whole-run replay on imported ones
(``engine.py``, :func:`replay_impacts`).

Each straggler's impact becomes the replayed gain of its pipeline slice over a window of
steps from its onset, with its phases at its same-stage peers' median. Where the run
cannot be replayed (no loader, no records in the window, too many rows, a graph that does
not finish) the finding keeps the excess-time estimate (``detectors/straggler.py: _impact``) and a note
says why.
"""

from __future__ import annotations

import dataclasses

import pandas as pd

from ranksight.ground.vocab import Kind
from ranksight.ground.words import counted

from ..findings import Finding
from .engine import balanced_stages, ops_from_tables, peer_median_durations, replay
from .slice import (
    ReplayError,
    ReplayFit,
    SliceReplay,
    groups_of,
    measured_step_ms,
    pipeline_slice,
    replay_fit,
    replay_ranks,
    replay_slice,
    window,
    with_peer_self,
)


def straggler_impacts(
    findings: list[Finding], data, coords: pd.DataFrame, peers: dict[int, list[int]]
) -> tuple[list[Finding], list[str]]:
    """``findings`` with each straggler's impact from a slice replay where it can run;
    ``data``: the run (``queries.RunData``, its ``fetch_slice`` loads the rows);
    ``peers``: culprit rank -> the same-stage peers its evidence was compared with."""
    if getattr(data, "fetch_slice", None) is None or data.groups.empty:
        return findings, []
    out, notes = [], []
    for f in findings:
        if f.kind != Kind.STRAGGLER or f.culprit_rank < 0 or f.culprit_rank not in coords.index:
            out.append(f)
            continue
        try:
            r, steps = _replay(f, data, coords, peers.get(f.culprit_rank, []))
        except ReplayError as exc:
            notes.append(
                f"rank {f.culprit_rank}'s impact counts all its extra time as delaying the "
                f"step (an upper bound): the pipeline could not be re-simulated without it ({exc})"
            )
            out.append(f)
            continue
        fit = replay_fit(data.steps, r, steps)
        if fit.misfit is not None and fit.misfit > MAX_REPLAY_ERROR:
            notes.append(
                f"rank {f.culprit_rank}'s impact counts all its extra time as delaying the "
                f"step (an upper bound): a re-simulation of its pipeline without it was not "
                f"trusted, as it took {fit.replayed_ms:.0f} ms for a step measured at "
                f"{fit.measured_ms:.0f} ms (more than {MAX_REPLAY_ERROR:.0%} off)"
            )
            out.append(f)
            continue
        out.append(with_replay(f, r, steps, fit))
    return out, notes


MAX_REPLAY_ERROR = 0.25
"""A replay whose step time with nothing changed is further than this share from the
measured step time of the same ranks and steps does not model the run well enough for
its counterfactual to be believed (e.g. work that overlapped in the run replayed one
after the other): the impact then stays the excess-time estimate."""


def joint_impacts(
    findings: list[Finding], data, coords: pd.DataFrame
) -> tuple[list[Finding], list[str]]:
    """``findings`` with the impacts of two or more stragglers composed by one what-if
    replay of them together: every rank of the run (every data-parallel replica, up to
    ``slice.MAX_RANKS`` ranks) over a window from the earliest onset, with all the
    culprits' compute at the median of their same-stage peers that are not culprits
    (``engine.peer_median_durations``). Their replayed gain together, ``J`` percent, is
    split in proportion to their own impacts, so that they add up to ``J``.

    Why: each straggler's own impact is the gain of fixing it alone in its own pipeline,
    with the other replicas taken to arrive no later. Two slow ranks in two data-parallel
    replicas then each claim the gain of both (33% each on the reference trainer, where
    their clean twin ran 45% faster), and their sum overstates it; fixing one alone gains
    little while the other still holds the all-reduce. Used only where the replay of the
    run as it was is within :data:`MAX_REPLAY_ERROR` of its measured step; else the
    findings stay as they were, with a note."""
    todo = [f for f in findings if f.kind == Kind.STRAGGLER and f.culprit_rank in coords.index]
    if len(todo) < 2 or getattr(data, "fetch_slice", None) is None or data.groups.empty:
        return findings, []
    culprits = [int(f.culprit_rank) for f in todo]
    ranks, every = replay_ranks(coords, set())
    who = ", ".join(str(r) for r in culprits)
    if not every or not set(culprits) <= set(ranks):
        return findings, [
            f"the impacts of ranks {who} are each the gain of fixing one alone: the run is too "
            f"large to replay them together ({counted(len(coords), 'rank')})"
        ]
    onset = min(int(f.evidence.get("onset_step", 0)) for f in todo)
    steps = window(data.steps, ranks, onset)
    try:
        if not steps:
            raise ReplayError("no step that every rank completed")
        tables = data.fetch_slice(ranks, groups_of(data.groups, ranks), steps, [])
        r = replay_slice(
            tables, lambda ops: peer_median_durations(ops, culprits, coords["pp"]), ranks
        )
    except ReplayError as exc:
        return findings, [f"ranks {who} could not be replayed together ({exc})"]
    fit = replay_fit(data.steps, r, steps)
    measured, replayed = fit.measured_ms, fit.replayed_ms
    if fit.misfit is None or fit.misfit > MAX_REPLAY_ERROR:
        return findings, [
            f"a what-if replay of ranks {who} together was not trusted: it took "
            f"{replayed:.0f} ms for a step measured at {measured:.0f} ms"
        ]
    joint = max(0.0, r.impact_pct)
    total = sum(float(f.impact_pct) for f in todo)
    if total <= 0:
        return findings, []
    scale = joint / total
    without_ms = float(r.step_ns_changed.mean()) / 1e6
    out = []
    for f in findings:
        if f not in todo:
            out.append(f)
            continue
        share = round(float(f.impact_pct) * scale, 1)
        others = ", ".join(str(c) for c in culprits if c != f.culprit_rank)
        summary = f.summary + (
            f"; replayed together with rank {others} ({counted(len(ranks), 'rank')}, "
            f"{replayed:.0f} -> {without_ms:.0f} ms a step), the slow ranks cost {joint:.0f}% "
            f"of the step, {share:.0f}% of it this one's share"
        )
        ev = {
            **f.evidence,
            "joint_whatif": {
                "culprits": culprits,
                "ranks": len(ranks),
                "steps": steps,
                **_fit_evidence(fit),
                "replayed_step_ms_now": round(replayed, 1),
                "replayed_step_ms_without": round(without_ms, 1),
                "joint_impact_pct": round(joint, 1),
                "own_impact_pct": f.impact_pct,
            },
            "impact_composed": "joint replay",
        }
        out.append(dataclasses.replace(f, impact_pct=share, summary=summary, evidence=ev))
    note = (
        f"the impacts of ranks {who} added up to {total:.0f}%; a what-if replay of "
        f"{counted(len(ranks), 'rank')} with all of them at their peers' median makes the step "
        f"{joint:.0f}% shorter: each is scaled by {scale:.2f}, in proportion to its own"
    )
    return out, [note]


def _replay(f: Finding, data, coords: pd.DataFrame, peers: list[int]):
    rank = f.culprit_rank
    ranks = pipeline_slice(coords, rank)
    steps = window(data.steps, ranks, int(f.evidence.get("onset_step", 0)))
    if not steps:
        raise ReplayError("no step that every rank of its pipeline completed")
    tables = data.fetch_slice(ranks, groups_of(data.groups, ranks), steps, peers)
    if tables.peer_self.empty:
        raise ReplayError("no peer phase records in the window")
    r = replay_slice(tables, lambda ops: with_peer_self(ops, rank, tables.peer_self), ranks)
    return r, steps


def with_replay(
    f: Finding, r: SliceReplay, steps: list[int], fit: ReplayFit | None = None
) -> Finding:
    """``f`` with its impact, summary ending and ``whatif`` evidence from ``r``; ``fit``:
    how well ``r`` reproduced the measured step (its misfit is the impact's error)."""
    impact = max(0.0, r.impact_pct)
    now_ms = float(r.step_ns_now.mean()) / 1e6
    without_ms = float(r.step_ns_changed.mean()) / 1e6
    summary = f.summary.rsplit("; without it", 1)[0] + (
        f"; a what-if replay of its pipeline ({counted(len(r.ranks), 'rank')}, {counted(len(steps), 'step')} from "
        f"step {steps[0]}) with its work at its same-stage peers' median makes the step "
        f"{impact:.0f}% shorter ({now_ms:.1f} -> {without_ms:.1f} ms)"
    )
    evidence = {
        **f.evidence,
        "whatif": {
            "method": "replay of the culprit's pipeline slice (its dp, tp)",
            "slice_ranks": r.ranks,
            "steps": steps,
            "replayed_step_ms_now": round(now_ms, 1),
            "replayed_step_ms_without": round(without_ms, 1),
            "impact_pct": round(impact, 1),
            "estimate_pct": f.impact_pct,
            **_fit_evidence(fit),
        },
    }
    return dataclasses.replace(f, impact_pct=round(impact, 1), summary=summary, evidence=evidence)


def _fit_evidence(fit: ReplayFit | None) -> dict:
    """The measured step and the replay's misfit (percent), where measured."""
    if fit is None or fit.misfit is None:
        return {}
    return {
        "measured_step_ms": round(fit.measured_ms, 1),
        "misfit_pct": round(100.0 * fit.misfit, 1),
    }


MAX_REPLAY_ROWS = 3_000_000
"""Most phase + collective rows replayed (about 10 s of replay per million ops)."""


def replay_impacts(
    findings: list[Finding], data, coords: pd.DataFrame
) -> tuple[list[Finding], list[str]]:
    """``findings`` with each compute straggler's impact from a what-if replay of the
    recorded steps (``whatif/engine.py``): the culprit's compute at its same-stage peers' median.
    The evidence gains ``whatif`` (slowdown, step times) and ``worker_or_stage``: how much
    faster balancing the stages would make the job once the culprit is fixed; a worker
    problem when fixing the worker gains more. Findings stay as they were (with a note)
    when there is nothing to replay or the records do not replay."""
    todo = [f for f in findings if f.kind == Kind.STRAGGLER and f.culprit_rank >= 0]
    if not todo or data.fetch_ops is None:
        return findings, []
    phases, colls = data.fetch_ops()
    if len(phases) + len(colls) > MAX_REPLAY_ROWS or phases.empty:
        return findings, ["what-if replay skipped: too many or no op records"]
    ops = ops_from_tables(phases, colls)
    role = coords["pp"]
    try:
        now = replay(ops)
    except ReplayError as exc:
        return findings, [f"what-if replay failed: {exc}"]
    out = []
    for f in findings:
        if f not in todo:
            out.append(f)
            continue
        fixed = peer_median_durations(ops, [f.culprit_rank], role)
        without, balanced = replay(fixed), replay(balanced_stages(fixed))
        out.append(_with_replay(f, now, without, balanced, _measured_ms(data.steps, now)))
    return out, []


def _measured_ms(steps: pd.DataFrame, now: pd.Series) -> float:
    """The mean measured job step (ms; ``STEPS`` rows, every rank) over the steps the
    replay replayed (``now``'s index); 0 where the records have none of them."""
    if steps.empty:
        return 0.0
    return measured_step_ms(steps, sorted({int(r) for r in steps["rank"]}), list(now.index))


def _with_replay(
    f: Finding, now: pd.Series, without: pd.Series, balanced: pd.Series, measured_ms: float = 0.0
) -> Finding:
    s = float(now.sum() / without.sum())
    stage = float(without.sum() / balanced.sum())
    verdict = "worker" if s - 1 >= stage - 1 else "stage imbalance"
    impact = 100.0 * (1 - 1 / s)
    summary = f.summary.rsplit("; without it", 1)[0] + (
        f"; a what-if replay of {counted(len(now), 'step')} with its compute at its same-stage peers' "
        f"median makes the job {s:.2f}x faster ({now.mean() / 1e9:.2f} s -> "
        f"{without.mean() / 1e9:.2f} s per step); balancing the stages after that would gain "
        f"{stage:.2f}x: a {verdict} problem"
    )
    evidence = {
        **f.evidence,
        "whatif": {"slowdown": round(s, 4), "steps": len(now),
                   "step_s_now": round(now.mean() / 1e9, 3),
                   "step_s_without": round(without.mean() / 1e9, 3), "method": "replay",
                   **_fit_evidence(ReplayFit(float(now.mean()) / 1e6, measured_ms))},
        "worker_or_stage": {"worker_slowdown": round(s, 4), "stage_slowdown": round(stage, 4),
                            "verdict": verdict},
    }  # fmt: skip
    return dataclasses.replace(f, impact_pct=round(impact, 1), summary=summary, evidence=evidence)
