"""Hang: per process group, the last sequence number each rank entered and completed;
aggregated stacks (identical stacks grouped, with their rank lists) where dumped."""

from __future__ import annotations

import streamlit as st

from ranksight.ui import cache
from ranksight.ui.context import PageContext
from ranksight.ui.data.hang import group_summary, open_ops, suspects
from ranksight.ui.guard import NoData


def render(ctx: PageContext) -> None:
    """The Hang page."""
    run = ctx.run
    st.header(f"Hang — {run.run_id}")
    progress = cache.group_progress(ctx.url, run)
    if progress.empty:
        raise NoData(f"Run {run.run_id} has no collective records yet.")
    named = suspects(progress, open_ops(cache.store_for(ctx.url), run))
    summary = group_summary(progress, named)
    stuck = summary[(summary["lagging"] != "") | (summary["stuck"] != "")]
    if stuck.empty:
        st.success(
            f"Every rank of all {len(summary)} groups entered and completed the same last "
            "collective: no rank is behind."
        )
    else:
        st.error(
            f"{len(stuck)} of {len(summary)} groups have ranks behind or blocked in a collective."
        )
    if named:
        st.error(
            f"Suspect rank(s) {', '.join(map(str, named))}: behind their peers and blocked in no "
            "collective or send/recv, so they never entered the one the others wait in. Their "
            "stacks (below) say where they are."
        )
    st.dataframe(summary, hide_index=True, width="stretch", key="hang_groups")
    gid = st.selectbox("Group", list(summary["group_id"]), index=0)
    mine = progress[progress["group_id"] == gid][
        ["rank", "last_entered", "last_done", "behind", "open_ops", "last_op"]
    ]
    st.dataframe(mine, hide_index=True, width="stretch", key="hang_members")
    _stacks(ctx)


def _stacks(ctx: PageContext) -> None:
    from ranksight.ui.data import stacks

    st.subheader("Stacks")
    groups = stacks.aggregated_stacks(cache.store_for(ctx.url), ctx.run)
    if groups is None:
        st.info("No stack dumps for this run (this store has no stacks table).")
        return
    if groups.empty:
        st.info("No stack dumps for this run (the agent takes them when progress stops).")
        return
    for g in groups.itertuples():
        with st.expander(f"{g.n_ranks} ranks: {g.ranks}"):
            st.code(g.stack, language=None)
