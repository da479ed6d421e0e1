"""Mesh: the DP x TP x PP grid as a picture, each rank colored by slowness, culprits
outlined, wait-for edges from their victims."""

from __future__ import annotations

import streamlit as st

from ranksight.ui import cache
from ranksight.ui.context import PageContext
from ranksight.ui.data.mesh import wait_edges
from ranksight.ui.figures.mesh import mesh_figure
from ranksight.ui.guard import NoData


def render(ctx: PageContext) -> None:
    """The Mesh page."""
    run = ctx.selected_run
    st.header(f"Mesh — {run.run_id}")
    if run.ranks.empty:
        raise NoData(f"Run {run.run_id} has no rank records yet.")
    slow = cache.slowness(ctx.url, run, ctx.mark, ctx.cfg.skip_steps)
    if slow["self_ms"].isna().all():
        raise NoData(f"Run {run.run_id} has no compute phases recorded yet.")
    edges = wait_edges(run)
    st.plotly_chart(
        mesh_figure(slow, run.shape, run.culprits, edges), width="stretch", key="mesh_chart"
    )
    st.caption(
        "Slowness: compute self time per step over the median of the other ranks of the same pipeline stage (1.0 = as fast as its peers)."
    )
    left, right = st.columns(2)
    with left:
        st.markdown("**Slowest ranks**")
        top = slow.sort_values("slowness", ascending=False).head(10)
        st.dataframe(top.round({"self_ms": 1, "slowness": 2}), hide_index=True, width="stretch")
    with right:
        st.markdown("**Wait-for edges** (victim waited for culprit)")
        if edges.empty:
            st.caption("No culprit, so no wait-for edges to show.")
        else:
            st.dataframe(edges, hide_index=True, width="stretch")
