"""Heatmap: rank x step, colored by a chosen metric, ranks in mesh order, culprits
marked; hover gives the numbers, a click selects that cell's rank and step."""

from __future__ import annotations

import streamlit as st

from ranksight.ui import cache
from ranksight.ui.context import PageContext, go, link_button
from ranksight.ui.data.heatmap import METRICS, Heatmap
from ranksight.ui.data.run import ORDERS
from ranksight.ui.figures.heatmap import (
    HEATMAP,
    RANK_STRIP,
    STEP_STRIP,
    chart_height,
    heatmap_figure,
    row_pick,
)
from ranksight.ui.guard import NoData

SUMMARIZING = (
    "Reading the heatmap. A run analyzed with `ranksight report --save` is read from its"
    " per-rank-step summary; steps after it are read from the raw rows (about 10 s for"
    " 1,024 ranks x 1,000 steps on 2 cores)."
)


def render(ctx: PageContext) -> None:
    """The Heatmap page."""
    run, sel = ctx.selected_run, ctx.sel
    st.header(f"Heatmap — {run.run_id}")
    span = cache.step_range(ctx.url, run, ctx.mark)
    if span is None:
        raise NoData(
            f"Run {run.run_id} has no step records yet; the heatmap fills in as steps land."
        )
    c1, c2, c3 = st.columns([2, 1, 2])
    metric = c1.selectbox(
        "Metric",
        list(METRICS),
        index=list(METRICS).index(sel.metric),
        format_func=METRICS.__getitem__,
    )
    order = c2.selectbox("Rank order", list(ORDERS), index=list(ORDERS).index(sel.order))
    steps = span
    if span[1] > span[0]:
        steps = c3.slider("Steps", span[0], span[1], value=span, key=f"hm_steps_{span}")
    if (metric, order) != (sel.metric, sel.order):
        go(sel, metric=metric, order=order)
    with st.spinner(SUMMARIZING):  # shown only past half a second
        h = cache.heatmap_cells(
            ctx.url,
            run,
            ctx.mark,
            metric,
            ORDERS[order],
            tuple(steps),
            ctx.cfg.heatmap_rows,
            ctx.cfg.heatmap_cols,
        )
    st.caption(_resolution(h, len(run.ranks)))
    spec = heatmap_figure(h, sel.rank, sel.step, ctx.cfg.skip_steps)
    event = st.echarts_chart(
        spec,
        width="stretch",
        height=chart_height(h.shape[0]),
        on_select="rerun",
        key=f"heatmap_chart_{sel.rank}_{sel.step}",
    )
    _follow_click(ctx, h, event)
    _selected(ctx, h)


def _resolution(h: Heatmap, world: int) -> str:
    rows, cols = h.shape
    text = f"{world} ranks in {rows} rows"
    text += (
        ""
        if h.rank_bin == 1
        else f" ({h.rank_bin} ranks per row; a cell shows the largest value, hover for the mean)"
    )
    text += f", steps {h.step_lo}..{h.step_hi} in {cols} columns" + (
        "" if h.step_bin == 1 else f" ({h.step_bin} steps each)"
    )
    return (
        text
        + ". Click a cell, or a bar of the rank strip (left) or the step strip (below), to select."
    )


def click_target(h: Heatmap, series: int, index: int) -> tuple[int | None, int | None] | None:
    """(rank, step) a click on item ``index`` of series ``series`` selects (None: keep
    that one): a rank-strip bar gives its row's slowest rank, a step-strip bar its
    column's first step, a heatmap cell the rank and step of its largest value (cells
    are row-major, see ``heatmap_figure``). None for anything else."""
    rows, cols = h.shape
    if series == RANK_STRIP and 0 <= index < rows:
        return row_pick(h, index), None
    if series == STEP_STRIP and 0 <= index < cols:
        return None, int(h.col_steps[index])
    if series == HEATMAP and 0 <= index < rows * cols:
        row, col = divmod(index, cols)
        if h.worst_rank[row, col] >= 0:
            return int(h.worst_rank[row, col]), int(h.worst_step[row, col])
    return None


def _follow_click(ctx: PageContext, h: Heatmap, event) -> None:
    groups = (event or {}).get("selection", {}).get("selected", []) if event else []
    for group in groups:
        for index in group.get("data_indices", []):
            target = click_target(h, int(group.get("series_index", -1)), int(index))
            if target is None or target == (None, None):
                continue
            rank = ctx.sel.rank if target[0] is None else target[0]
            step = ctx.sel.step if target[1] is None else target[1]
            if (rank, step) != (ctx.sel.rank, ctx.sel.step):
                go(ctx.sel, rank=rank, step=step)


def _selected(ctx: PageContext, h: Heatmap) -> None:
    sel, run = ctx.sel, ctx.selected_run
    if sel.rank is None and sel.step is None:
        return
    ranks = run.ranks.set_index("rank")
    parts = []
    if sel.rank is not None and sel.rank in ranks.index:
        r = ranks.loc[sel.rank]
        culprit = " — a culprit" if sel.rank in run.culprits else ""
        parts.append(
            f"rank {sel.rank} (host {r['host']}, dp {r['dp']}, tp {r['tp']}, pp {r['pp']}){culprit}"
        )
    if sel.step is not None:
        parts.append(f"step {sel.step}")
    st.markdown("**Selected:** " + ", ".join(parts))
    cols = st.columns(3)
    step = sel.step if sel.step is not None else h.step_lo
    with cols[0]:
        link_button(f"Timeline of step {step}", sel, "hm_to_tl", page="timeline", step=step)
    with cols[1]:
        link_button("Mesh", sel, "hm_to_mesh", page="mesh")
    with cols[2]:
        link_button("Clear selection", sel, "hm_clear", rank=None, step=None)
