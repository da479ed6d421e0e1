"""Timeline: for a chosen step (or window), every rank's phases and collectives on one
aligned time axis, with one collective's members linked so the late arriver shows."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from ranksight.ui import cache
from ranksight.ui.context import PageContext, go
from ranksight.ui.figures.timeline import timeline_figure
from ranksight.ui.guard import NoData

UNFINISHED = ("running", "hung", "stopped", "crashed")
"""Statuses of a run whose last step may have rows of its phases and collectives but no
step row: the step it is in, hung in, or died in."""


def default_step(ctx: PageContext, span: tuple[int, int]) -> int:
    """The selected step, else the step after the top finding's onset, else the last."""
    if ctx.sel.step is not None:
        return min(max(ctx.sel.step, span[0]), span[1])
    for f in ctx.selected_run.findings:
        if "onset_step" in f.evidence:
            return min(int(f.evidence["onset_step"]) + 1, span[1])
    return span[1]


def render(ctx: PageContext) -> None:
    """The Timeline page."""
    run, sel = ctx.selected_run, ctx.sel
    st.header(f"Timeline — {run.run_id}")
    span = cache.step_range(ctx.url, run, ctx.mark)
    if span is None:
        raise NoData(
            f"Run {run.run_id} has no step records yet; the timeline fills in as steps land."
        )
    if ctx.status in UNFINISHED:  # the step in progress (or the one it hung in) too
        span = (span[0], span[1] + 1)
    c1, c2, c3 = st.columns(3)
    step = c1.number_input("Step", span[0], span[1], value=default_step(ctx, span), step=1)
    window = c2.number_input(
        "Steps in the window", 1, 4, value=min(max(sel.window or 1, 1), 4), step=1
    )
    center = run.culprits[0] if sel.rank is None and run.culprits else sel.rank
    ranks = list(run.ranks["rank"].astype(int))
    rank = c3.selectbox("Around rank", ranks, index=ranks.index(center) if center in ranks else 0)
    if (step, window, rank) != (sel.step, sel.window or 1, sel.rank):
        go(sel, step=int(step), window=int(window) if window > 1 else None, rank=int(rank))
    steps = (int(step), min(int(step) + int(window) - 1, span[1]))
    tl = cache.timeline_rows(
        ctx.url, run, ctx.mark, steps, ctx.order, int(rank), ctx.cfg.timeline_ranks
    )
    if tl.phases.empty and tl.collectives.empty:
        raise NoData(
            f"No phase or collective records for steps {steps[0]}..{steps[1]} of run {run.run_id}."
        )
    members = _chosen_instance(ctx, steps, tl.origin_ns)
    marked = tuple(run.culprits)
    fig = timeline_figure(tl, members, marked)
    st.plotly_chart(fig, width="stretch", key="timeline_chart")
    st.caption(
        f"{len(tl.ranks)} of {len(run.ranks)} ranks, in {sel.order} order around rank {rank}"
        + (
            f"; ★ marks the culprit{'s' if len(marked) > 1 else ''} of the findings"
            if marked
            else ""
        )
        + ". Hatched bars ran past the window's end (or never ended) and are cut there. "
        "Drag to zoom, double-click to reset, shift-drag to pan. Times are each host's realtime clock."
    )


def _chosen_instance(
    ctx: PageContext, steps: tuple[int, int], origin_ns: int
) -> pd.DataFrame | None:
    inst = cache.instances(ctx.url, ctx.selected_run, ctx.mark, steps)
    if inst.empty:
        st.caption("No collectives recorded in this window.")
        return None
    labels = [
        f"{r.op} {r.group_id}#{r.group_seq}: rank {r.last_rank} last, {r.skew_ms:.1f} ms after the first of {r.members}"
        for r in inst.itertuples()
    ]
    pick = st.selectbox(
        "Link the members of one collective (most skewed first)",
        range(len(inst)),
        format_func=labels.__getitem__,
    )
    row = inst.iloc[int(pick)]
    return cache.members(
        ctx.url, ctx.selected_run, str(row["group_id"]), int(row["group_seq"]), origin_ns
    )
