"""Render an analysis for people (rich text, Markdown) and machines (JSON)."""

from __future__ import annotations

import functools
import json
from dataclasses import asdict

from rich.console import Console
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table

from ranksight.analyzer import Analysis, Finding, StragglerConfig
from ranksight.analyzer.imported import is_imported
from ranksight.ground.vocab import NOT_FAULTS, Kind
from ranksight.ground.words import counted, span

EXIT_CLEAN = 0
"""``ranksight report`` / ``demo`` exit code when no culprit was found."""
EXIT_CULPRIT = 3
"""Exit code when at least one culprit was found (1 is an error, 2 a usage error)."""

FORMATS = ("text", "json", "markdown")
UNDECIDED = (
    "these artifacts show no timeout, error or failure, and no rank behind the others: "
    "whether the job hung, and where, cannot be told from them (each rank's own log, a "
    "Flight Recorder dump or py-spy stacks of every rank can)"
)
"""What the report says of an imported run whose artifacts show no fault."""


def signature(analysis: Analysis) -> list[tuple]:
    """What ``report --watch`` compares between analyses: each finding's kind, culprit
    and cause (not its numbers, which move every step)."""
    return [(f.kind, f.culprit_rank, f.cause) for f in analysis.findings]


def exit_code(analysis: Analysis) -> int:
    """:data:`EXIT_CULPRIT` if the analysis names anyone, else :data:`EXIT_CLEAN`
    (findings that are no fault, ``findings.NOT_FAULTS``, name no one)."""
    faults = [f for f in analysis.findings if f.kind not in NOT_FAULTS]
    return EXIT_CULPRIT if faults else EXIT_CLEAN


def _who(f: Finding) -> str:
    """Whom ``f`` names (:meth:`Finding.who`)."""
    return f.who()


def to_json(analysis: Analysis, run: dict | None = None) -> str:
    """The analysis as one JSON document (findings with their evidence). ``fault_found``:
    any finding (what exit code 3 says); ``culprit_found``: a finding names one rank
    (``culprit_rank`` >= 0), not only suspects, a group, a host or no single rank."""
    doc = {
        "run_id": analysis.run_id,
        "attempt": analysis.attempt,
        "status": (run or {}).get("status", ""),
        "steps_analyzed": analysis.steps_analyzed,
        "median_step_ms": round(analysis.median_wall_step_ms or analysis.median_step_ms, 1),
        "median_rank_step_ms": round(analysis.median_step_ms, 1),
        "fault_found": bool(analysis.findings),
        "culprit_found": any(f.culprit_rank >= 0 for f in analysis.findings),
        "findings": [asdict(f) for f in analysis.findings],
        "notes": analysis.notes,
        "clock": analysis.clock,
    }
    return json.dumps(doc, indent=2, default=str)


def phase_rows(phases: dict) -> list[tuple[str, str, str, str]]:
    """(phase, rank ms, peers ms, ratio) as text of a straggler's ``phases`` evidence:
    one decimal for ms, ``1.96x`` for the ratio (the text report, Markdown and the UI)."""
    return [
        (name, f"{p['rank_ms']:.1f}", f"{p['peers_ms']:.1f}", f"{p['ratio']:.2f}x")
        for name, p in phases.items()
    ]


def _phase_rows(f: Finding) -> list[tuple[str, str, str, str]]:
    return phase_rows(f.evidence.get("phases", {}))


def _wait_rows(f: Finding) -> list[tuple[str, str]]:
    """(by, ms) rows of the time others waited for a straggler: per mesh axis, per op."""
    w = f.evidence.get("waited_for_it", {})
    return [(f"{axis} group", f"{ms:.0f}") for axis, ms in w.get("by_axis_ms", {}).items()] + [
        (f"in {op}", f"{ms:.0f}") for op, ms in w.get("by_op_ms", {}).items()
    ]


def _waits_title(f: Finding) -> str:
    return (
        f"time others waited for rank {f.culprit_rank} (from step {f.evidence.get('onset_step')})"
    )


def _victims(f: Finding) -> str:
    """``rank N (M ms), ...``: the ranks that waited for a straggler directly."""
    victims = f.evidence.get("waited_for_it", {}).get("victims", [])
    return ", ".join(f"rank {v['rank']} ({v['waited_ms']:.0f} ms)" for v in victims) or "none"


def step_summary(analysis: Analysis, sep: str) -> str:
    """``sep`` + the median step: the job's (first rank's start to last rank's end, as
    the UI's overview shows it) and the median rank's own; nothing without steps."""
    if not analysis.steps_analyzed:
        return ""
    wall, own = analysis.median_wall_step_ms, analysis.median_step_ms
    if wall <= 0:
        return f"{sep}median step {own:.0f} ms"
    return f"{sep}median step {wall:.0f} ms (a rank's own: {own:.0f} ms)"


def print_text(analysis: Analysis, console: Console, run: dict | None = None) -> None:
    """Print the report with rich: a headline, then per finding its evidence tables.
    Lines outside a panel or table are never broken (``soft_wrap``): piped into a file
    or a ticket, a sentence stays one line, not cut at 80 columns mid-phrase."""
    say = functools.partial(console.print, soft_wrap=True)
    head = (
        f"run [bold]{escape(str(analysis.run_id))}[/] attempt {analysis.attempt}"
        f" · status {escape(str((run or {}).get('status', '?')))}"
        f" · {counted(analysis.steps_analyzed, 'step')} analyzed"
        f"{step_summary(analysis, ' · ')}"
    )
    say(head)
    c = analysis.clock
    if c.get("ranks"):
        say(
            f"[dim]clock alignment over {counted(c['ranks'], 'rank')}: worst offset "
            f"{c['max_abs_offset_us']} µs, uncertainty {c['median_uncertainty_us']} µs "
            f"({counted(c['samples_per_rank'], 'collective')} per rank)[/]"
        )
    for note in analysis.notes:
        say(f"[dim]note: {escape(note)}[/]")
    if not analysis.findings:
        fewest = StragglerConfig().min_slow_steps
        verdict = (
            f"[yellow]Too few steps to judge[/]: {counted(analysis.steps_analyzed, 'step')} "
            f"analyzed, and a straggler is named only after {fewest} slow steps in a row "
            "(fewer can be noise); no hang, crash or desync in them. Widen --steps / --since."
            if 0 < analysis.steps_analyzed < fewest
            else "[green]No culprit found[/]: every rank is within the threshold of its "
            "same-stage peers."
            if analysis.steps_analyzed
            else f"[yellow]Undecided[/]: {UNDECIDED}"
            if is_imported(run or {})
            else "[yellow]No step records to compare ranks on[/] in this window (or none "
            "recorded yet); no hang, crash or desync in what there is."
        )
        console.print(Panel(verdict, title="ranksight report"))
        return
    for i, f in enumerate(analysis.findings, 1):
        title = (
            f"#{i} {f.kind}: {_who(f)} — cause: {f.cause} "
            f"(confidence {f.confidence:.2f}, impact {f.impact_pct:.0f}%)"
        )
        console.print(Panel(escape(f.summary), title=escape(title), border_style="red"))
        if f.kind != Kind.STRAGGLER:
            _print_evidence(f, console)
            continue
        phases = Table(title="self time per call vs same-stage peers", show_lines=False)
        for col in ("phase", f"rank {f.culprit_rank} ms", "peers ms (median)", "ratio"):
            phases.add_column(col)
        for row in _phase_rows(f):
            phases.add_row(*map(escape, row))  # phase names are the job's own
        console.print(phases)
        w = f.evidence.get("waited_for_it", {})
        waits = Table(title=_waits_title(f))
        waits.add_column("by")
        waits.add_column("ms", justify="right")
        for wait_row in _wait_rows(f):
            waits.add_row(*map(escape, wait_row))
        console.print(waits)
        say(f"victims (waited directly): {_victims(f)}")
        say(
            f"last arriver in {100 * w.get('last_share', 0):.0f}% of its collectives; "
            f"{now_and_without(f)}."
        )


def now_and_without(f: Finding) -> str:
    """A straggler's impact figures in the README's step-time words, the same figures its
    impact comes from: the job step measured before and after its onset
    (analyzer/impact.py) where the run has steps before it, else the what-if replay's
    where one was trusted, else the estimate ``from step 4, a rank's step averaged 1839.4 ms; about 632.3 ms
    without it`` (evidence ``onset_step``, ``step_ms_now``, ``step_ms_without``)."""
    ev = f.evidence
    if ev.get("impact_method") == "before/after":
        return (
            f"from step {ev.get('onset_step')}, the job step averaged "
            f"{ev.get('job_step_ms_after')} ms against {ev.get('job_step_ms_before')} ms before "
            f"(measured; its own time alone suggested {ev.get('estimated_impact_pct')}%)"
        )
    w = ev.get("whatif") or {}
    if "step_s_now" in w:  # a replay of every recorded step (an imported trace)
        return (
            f"a re-simulation of the recorded steps takes {w['step_s_now']} s a step as it "
            f"ran and {w['step_s_without']} s with its work at its peers' median"
            + (f" ({w['misfit_pct']}% off the measured step)" if "misfit_pct" in w else "")
        )
    if "replayed_step_ms_now" in w:
        return (
            f"from step {ev.get('onset_step')}, a re-simulation of its pipeline takes "
            f"{w['replayed_step_ms_now']} ms a step as it ran and {w['replayed_step_ms_without']} ms "
            "with its work at its peers' median"
        )
    return (
        f"from step {ev.get('onset_step')}, a rank's step averaged {ev.get('step_ms_now')} ms; "
        f"about {ev.get('step_ms_without')} ms without it (an estimate: at most this much)"
    )


TEXT_HIDDEN = ("groups", "positions", "pairs", "hang", "frames", "per_step", "steps_by_rank")
"""Evidence keys the text report leaves to ``--format json`` (per-rank detail)."""


def _where(entries: list[dict], limit: int = 8) -> str:
    """Blocked ranks as sentences, one per op they wait in: ``ranks 2,3 in all_reduce #5
    (tp group of ranks 2,3)``; past ``limit`` ops, how many more (``--format json`` has
    every one). ``entries``: dicts with ``ranks``, ``op``, ``seq``, ``group``."""
    by_op: dict[tuple, list[int]] = {}
    for e in entries:
        key = (e.get("op", "?"), e.get("seq", -1), e.get("group") or e.get("group_id", ""))
        by_op.setdefault(key, []).extend(e["ranks"])
    parts = [
        f"{'rank' if len(set(r)) == 1 else 'ranks'} {span(r)} in {op} #{seq} ({group})"
        for (op, seq, group), r in by_op.items()
    ]
    more = f"; {len(parts) - limit} more (--format json)" if len(parts) > limit else ""
    return "; ".join(parts[:limit]) + more


def main_thread(stack: str, frames: int = 3) -> str:
    """The main thread's innermost ``frames`` frames of a stack summary (one line per
    thread, ``MainThread (pid) idle: f (file:line) <- g (...)``); the first line if no
    thread is named so."""
    lines = [ln for ln in str(stack).splitlines() if ln.strip()]
    line = next((ln for ln in lines if ln.startswith("MainThread")), lines[0] if lines else "")
    body = line.split(": ", 1)[1] if ": " in line else line
    return " <- ".join(body.split(" <- ")[:frames])


def _stacks_text(stacks: dict) -> str:
    """``ranks 4-7: f <- g; ranks 0,1: ...``: the blocked ranks grouped by where their
    main thread is (``--format json`` has every thread)."""
    by: dict[str, list[int]] = {}
    for rank, stack in stacks.items():
        by.setdefault(main_thread(stack), []).append(int(rank))
    return "; ".join(
        f"{'rank' if len(r) == 1 else 'ranks'} {span(r)}: {where}"
        for where, r in sorted(by.items(), key=lambda kv: -len(kv[1]))
    )


def _hang_text(key: str, value) -> str | None:
    """The text of a hang's ``waiting_on_root`` / ``blocked`` evidence (:func:`_where`) and
    its stacks, else None."""
    if key == "blocked_stacks" and isinstance(value, dict):
        return _stacks_text(value)
    if key == "culprit_stack" and isinstance(value, str):
        return main_thread(value, frames=6)
    if key == "waiting_on_root" and isinstance(value, list):
        return _where([{**e, "ranks": e.get("blocked_ranks", [])} for e in value])
    if key == "blocked" and isinstance(value, dict):
        return _where([{**e, "ranks": [int(r)]} for r, e in value.items()])
    return None


def _evidence_lines(f: Finding) -> list[tuple[str, str]]:
    """(key, text) of a non-straggler finding's evidence: nested values as JSON, rank
    lists as ranges, per-rank detail left to ``--format json``."""
    out = []
    for key, value in f.evidence.items():
        if key in TEXT_HIDDEN or value in ([], "", None):
            continue
        if key in ("suspects", "silent", "no_timeout", "blocked", "roots", "gone") and isinstance(
            value, list
        ):
            text = span(value)
        elif (hang := _hang_text(key, value)) is not None:
            text = hang
        elif key == "alternatives" and isinstance(value, list):
            text = "; ".join(str(v) for v in value)
        else:
            text = (
                str(value)
                if isinstance(value, (int, float, str))
                else json.dumps(value, default=str)
            )
        out.append((key, str(text)))
    return out


def _print_evidence(f: Finding, console: Console) -> None:
    """Evidence of a non-straggler finding, one line per key (:func:`_evidence_lines`);
    text from a job's log is printed as it is, never read as markup."""
    for key, text in _evidence_lines(f):
        console.print(f"  {key}: {escape(text)}", soft_wrap=True)


def to_markdown(analysis: Analysis, run: dict | None = None) -> str:
    """The report as Markdown (a headline and one section per finding)."""
    lines = [
        f"# ranksight report: {analysis.run_id} (attempt {analysis.attempt})",
        "",
        f"{counted(analysis.steps_analyzed, 'step')} analyzed{step_summary(analysis, '; ')}; "
        f"status {(run or {}).get('status', '?')}.",
        "",
    ]
    if not analysis.findings:
        lines.append(
            "**No culprit found.**"
            if analysis.steps_analyzed
            else f"**Undecided:** {UNDECIDED}"
            if is_imported(run or {})
            else "**No step records to compare ranks on; no hang, crash or desync.**"
        )
    lines += [f"- note: {n}" for n in analysis.notes] + ([""] if analysis.notes else [])
    for i, f in enumerate(analysis.findings, 1):
        lines += [
            f"## {i}. {f.kind}: {_who(f)}, cause {f.cause}",
            "",
            f"Confidence {f.confidence:.2f}, impact {f.impact_pct:.0f}%.",
            "",
            f.summary,
            "",
        ]
        if rows := _phase_rows(f):
            lines += ["| phase | rank ms | peers ms | ratio |", "|---|---|---|---|"]
            lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows]
            lines.append("")
        elif f.kind != Kind.STRAGGLER:
            lines += [f"- {k}: {v}" for k, v in _evidence_lines(f)] + [""]
        if f.kind == Kind.STRAGGLER:
            lines += [f"{_waits_title(f)}:", "", "| by | ms |", "|---|---:|"]
            lines += [f"| {by} | {ms} |" for by, ms in _wait_rows(f)]
            lines += ["", f"Victims (waited directly): {_victims(f)}.", ""]
            lines += [f"{now_and_without(f)[0].upper()}{now_and_without(f)[1:]}.", ""]
    return "\n".join(lines) + "\n"


def emit(analysis: Analysis, run_row: dict, format: str, out: Console | None = None) -> None:
    """Print the analysis in ``format`` (one of :data:`FORMATS`): JSON and Markdown on
    stdout, text on ``out`` (default: a console on stdout)."""
    if format == "json":
        print(to_json(analysis, run_row))
    elif format == "markdown":
        print(to_markdown(analysis, run_row), end="")
    else:
        print_text(analysis, out or Console(), run_row)
