"""Run overview: step time and throughput over steps; findings ranked by impact, each
with its evidence and links to the heatmap, timeline and mesh that show it."""

from __future__ import annotations

import json

import pandas as pd
import streamlit as st

from ranksight.analyzer import Finding
from ranksight.report import now_and_without, phase_rows
from ranksight.ui import cache
from ranksight.ui.context import PageContext, link_button
from ranksight.ui.data.onsets import STOPPED, finding_step, onset_marks
from ranksight.ui.data.overview import flops_of
from ranksight.ui.figures.overview import HEIGHT, overview_figure
from ranksight.ui.guard import NoData


def render(ctx: PageContext) -> None:
    """The Run overview page."""
    run = ctx.selected_run
    series = cache.step_series(ctx.url, run, ctx.mark, ctx.cfg.overview_points)
    st.header(f"Run {run.run_id}")
    _headline(ctx, series)
    if series.empty:
        if run.findings:  # read from what a job left behind: no steps, findings all the same
            st.info(f"Run {run.run_id} has no step records: what its artifacts show is below.")
            _findings(ctx)
            return
        raise NoData(f"Run {run.run_id} has no step records yet; this page fills in as steps land.")
    marks = onset_marks(run.findings, cache.last_steps(ctx.url, run, ctx.mark))
    st.echarts_chart(
        overview_figure(series, marks), width="stretch", height=HEIGHT, key="overview_chart"
    )
    note = _stagger_note(series)
    if note:
        st.caption(note)
    st.caption(_flops_note(ctx, series))
    _findings(ctx)


def _stagger_note(series: pd.DataFrame) -> str:
    """Why the slowest rank's own step runs below the job's step time, with this run's
    median gap (ms); "" when the two lines meet (under 1% apart)."""
    gap = (series["step_ms"] - series["slowest_rank_ms"]).median()
    if not gap >= 0.01 * series["step_ms"].median():
        return ""
    return (
        "Step time: the first rank's start to the last rank's end. A rank's own step (its "
        "start to its end) is never longer: the slowest one runs below by how far the "
        f"ranks' starts and ends are staggered (median {gap:.0f} ms here; pipeline stages "
        "start one after another)."
    )


def _flops_note(ctx: PageContext, series: pd.DataFrame) -> str:
    """How the run's model FLOPs are known, and what is shown for them."""
    per_token, peak = flops_of(ctx.selected_run.row.get("meta_json", ""))
    if per_token is None:
        return "MFU: not shown (the run recorded no model FLOPs per token)."
    meta = _meta(ctx)
    how = meta.get("model_flops_formula") or "as the run recorded it"
    text = f"Model FLOPs: {per_token / 1e6:,.2f} MFLOP per token, by {how}."
    if peak is None:
        why = meta.get("peak_flops_source") or "unknown"
        tail = _tail(ctx, series)
        world = int(ctx.selected_run.row.get("world_size") or len(ctx.selected_run.ranks) or 1)
        if len(tail):
            tf = tail["tflops"].median()
            text += f" Achieved {tf:.4g} TFLOP/s ({1000 * tf / world:.4g} GFLOP/s per rank)."
        return text + f" MFU: not shown, the peak FLOP/s per rank is {why}."
    return (
        text
        + f" MFU against {peak / 1e12:,.1f} TFLOP/s per rank ({_meta(ctx).get('peak_flops_source', 'recorded')})."
    )


def duration_text(ms: float) -> str:
    """``"850 ms"`` below a second, ``"1.98 s"`` from there (fits a metric column)."""
    return f"{ms:.0f} ms" if ms < 999.5 else f"{ms / 1000:.2f} s"


def _meta(ctx: PageContext) -> dict:
    try:
        got = json.loads(ctx.selected_run.row.get("meta_json") or "{}")
    except ValueError:
        return {}
    return got if isinstance(got, dict) else {}


def _tail(ctx: PageContext, series: pd.DataFrame) -> pd.DataFrame:
    """The series after the warm-up steps (all of it when that is all there is)."""
    return series.iloc[ctx.cfg.skip_steps :] if len(series) > ctx.cfg.skip_steps else series


def _headline(ctx: PageContext, series: pd.DataFrame) -> None:
    run = ctx.selected_run
    cols = st.columns(4) + st.columns(4)  # two lines: a value never cut at 1,280 px
    shape = run.shape
    cols[0].metric("status", ctx.status or str(run.row.get("status")))
    cols[1].metric("world size", int(run.row.get("world_size") or len(run.ranks)))
    cols[2].metric("mesh dp x tp x pp", f"{shape['dp']} x {shape['tp']} x {shape['pp']}")
    cols[3].metric("steps", len(series) and int(series["n_steps"].sum()))
    tail = _tail(ctx, series)
    cols[4].metric("median step", duration_text(tail["step_ms"].median()) if len(tail) else "-")
    cols[5].metric("tokens/s", f"{tail['tokens_per_s'].median():,.0f}" if len(tail) else "-")
    if len(tail) and tail["mfu"].notna().any():
        cols[6].metric("MFU", f"{100 * tail['mfu'].median():.1f}%")
    elif len(tail) and tail["tflops"].notna().any():
        cols[6].metric("model TFLOP/s", f"{tail['tflops'].median():.4g}")
    else:
        cols[6].metric("MFU", "-")


def _findings(ctx: PageContext) -> None:
    run = ctx.selected_run
    st.subheader(f"Findings ({len(run.findings)}), by impact")
    if not run.findings:
        st.success(
            "No culprit found in the latest analysis (or the run was not analyzed yet: ranksight report --run RUN)."
        )
        return
    last = cache.last_steps(ctx.url, run, ctx.mark)
    for i, f in enumerate(run.findings):
        with st.container(border=True):
            st.markdown(
                f"**{i + 1}. {f.kind}: {f.who()}, {f.cause}** — impact {f.impact_pct:.1f}%, confidence {f.confidence:.2f}"
            )
            st.write(f.summary)
            _links(ctx, i, f, finding_step(f, last))
            if ctx.sel.finding == i:
                evidence(f)


def _links(ctx: PageContext, i: int, f: Finding, step: int | None) -> None:
    """Buttons to the pages that show finding ``i``: its evidence, the heatmap, the
    timeline at the step it starts at (``step``, see ``data.onsets``), the mesh, and
    for a hang or crash the Hang page."""
    stopped = f.kind in STOPPED
    cols = st.columns(5 if stopped else 4)
    rank = f.culprit_rank if f.culprit_rank >= 0 else None
    with cols[0]:
        link_button("Evidence", ctx.sel, f"ev{i}", finding=i)
    with cols[1]:
        link_button("Heatmap", ctx.sel, f"hm{i}", page="heatmap", rank=rank)
    with cols[2]:
        link_button("Timeline", ctx.sel, f"tl{i}", page="timeline", rank=rank, step=step)
    with cols[3]:
        link_button("Mesh", ctx.sel, f"me{i}", page="mesh", rank=rank)
    if stopped:
        with cols[4]:
            link_button("Hang", ctx.sel, f"hg{i}", page="hang", rank=rank)


def evidence(f: Finding) -> None:
    """The numbers a finding rests on: phase times against same-stage peers, who waited
    for the culprit and how long, the step time with and without it."""
    ev = f.evidence
    coords = [f"{axis} {v}" for axis, v in f.coords().items() if v >= 0]
    where = ", ".join([f"host {f.host}"] * bool(f.host) + coords)
    # who(): the rank, or the stage, group or ranks a finding without one names (never -1)
    st.markdown(f"**Evidence for {f.who()}**" + (f" ({where})" if where else ""))
    phases = ev.get("phases") or {}
    if phases:
        st.table(phase_table(phases, f.culprit_rank))
    waited = ev.get("waited_for_it") or {}
    if waited.get("victims"):
        st.markdown(
            f"Others waited **{waited.get('total_ms', 0) / 1000:.1f} s** for it; last arriver in {100 * waited.get('last_share', 0):.0f}% of its collectives."
        )
        st.table(
            pd.DataFrame(waited["victims"]).rename(
                columns={"rank": "victim rank", "waited_ms": "waited ms"}
            )
        )
    if "step_ms_now" in ev:
        line = now_and_without(f)
        st.markdown(
            f"{line[0].upper()}{line[1:]}; slow on {ev.get('slow_steps')} of {ev.get('steps_from_onset')} steps."
        )
    with st.expander("all evidence (JSON)"):
        st.json(ev)


def phase_table(phases: dict, rank: int) -> pd.DataFrame:
    """Per phase: the rank's and its peers' median self time per call (ms, one decimal),
    the ratio (``1.96x``), as the text report prints them (``report.phase_rows``)."""
    columns = ["phase", f"rank {rank} ms", "peers ms (median)", "ratio"]
    rows = sorted(phase_rows(phases))
    return pd.DataFrame(rows, columns=columns)
