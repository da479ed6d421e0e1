"""Hang: per process group, the last sequence number each rank entered and completed;
aggregated stacks (identical stacks grouped, with their rank lists) where dumped.

The numbers come from the progress snapshots while a run has them (live: they show a
hang while the stuck ops have no collective rows yet), else from the collective rows.
"""

from __future__ import annotations

import time

import pandas as pd
import streamlit as st

from ranksight.analyzer.detectors.hang import find_hang
from ranksight.ground.vocab import Kind
from ranksight.ui import cache
from ranksight.ui.context import PageContext
from ranksight.ui.data import stacks
from ranksight.ui.data.hang import group_summary, open_ops, suspects
from ranksight.ui.guard import NoData
from ranksight.ui.live import ago

MEMBER_COLUMNS = {
    "rank": "rank",
    "last_entered": "last entered",
    "last_done": "last completed",
    "behind": "behind",
    "open_ops": "open ops",
    "last_op": "last op",
}


def render(ctx: PageContext) -> None:
    """The Hang page."""
    run = ctx.selected_run
    st.header(f"Hang — {run.run_id}")
    snap = cache.hang_snapshots(ctx.url, run, ctx.mark, cache.progress_newest(ctx.url, run))
    if snap.progress.empty:
        progress = cache.group_progress(ctx.url, run, ctx.mark)
        if progress.empty:
            raise NoData(f"Run {run.run_id} has no progress snapshots or collective records yet.")
        named = suspects(progress, open_ops(cache.store_for(ctx.url), run))
        st.caption("From the collective records (this run has no progress snapshots).")
    else:
        progress, named = snap.progress, suspects(snap.progress, snap.open_by_rank)
        age = (time.time_ns() - snap.newest_ns) / 1e9
        st.caption(
            f"From the progress snapshots each rank's hooks take every 2 s (the newest "
            f"{ago(age)} old, {snap.ranks} ranks reporting), raised to the collective "
            "records where those are further."
        )
        stalled = _stall(ctx, snap)
        if not stalled and ctx.status == "running":
            named = []  # in flight, not stuck: suspects only once the run stalls
    dumps = stacks.aggregated_stacks(cache.store_for(ctx.url), run)
    _verdict(ctx, progress, named, dumps)
    summary = group_summary(progress, named)
    st.dataframe(summary, hide_index=True, width="stretch", key="hang_groups")
    gid = st.selectbox("Group", list(summary["group_id"]), index=0)
    st.dataframe(member_table(progress, gid), hide_index=True, width="stretch", key="hang_members")
    _stacks(dumps)


def member_table(progress: pd.DataFrame, group_id: str) -> pd.DataFrame:
    """One group's members: rank, last entered, last completed (sequence numbers),
    behind the group's furthest, open ops, last op (and, from snapshots, the step the
    rank is in, blank where its hooks did not say, and how old its snapshot is, s)."""
    mine = progress[progress["group_id"] == group_id]
    out = mine[list(MEMBER_COLUMNS)].rename(columns=MEMBER_COLUMNS)
    if "seen_ns" in mine:
        out["at step"] = pd.array(mine["at_step"].where(mine["at_step"] >= 0), dtype="Int64")
        newest = int(progress["seen_ns"].max())
        out["snapshot age s"] = ((newest - mine["seen_ns"]) / 1e9).round(1).to_numpy()
    return out.reset_index(drop=True)


def _verdict(
    ctx: PageContext, progress: pd.DataFrame, named: list[int], dumps: pd.DataFrame | None
) -> None:
    summary = group_summary(progress, named)
    stuck = summary[(summary["lagging"] != "") | (summary["stuck"] != "")]
    hangs = [f for f in ctx.selected_run.findings if f.kind == Kind.HANG]
    for f in hangs:  # the stored analysis, when the run was analyzed
        st.error(f"Analysis: {f.summary}")
    if not stuck.empty and ctx.status == "running" and not hangs and not named:
        st.info(
            f"The run is progressing: ranks of {len(stuck)} of {len(summary)} groups were "
            "inside a collective at the last snapshot, which is normal mid-step."
        )
    elif stuck.empty:
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
            "collective or send/recv, so they never entered the one the others wait in. "
            + _where_they_are(named, dumps)
        )


def _where_they_are(named: list[int], dumps: pd.DataFrame | None) -> str:
    """What the stack dumps say of the suspects: where to look, or that there are none."""
    if dumps is None or dumps.empty:
        return "No stack dumps were taken, so where they are is not known."
    dumped = {int(r) for ranks in dumps["ranks"] for r in str(ranks).split(",") if r.strip()}
    have = [r for r in named if r in dumped]
    if not have:
        return "The stack dumps (below) hold none of them."
    return f"Their stacks (below: rank(s) {', '.join(map(str, have))}) say where they are."


def _stall(ctx: PageContext, snap) -> bool:
    """The analyzer's live hang test over the snapshots (no step ended for a while
    although snapshots keep coming; root ranks from the wait-for edges), shown if it
    fires. Returns whether it did."""
    report = find_hang(snap.latest, ctx.mark.last_end_ns)
    if report is None:
        return False
    roots = ", ".join(map(str, report.roots)) or "none found"
    gone = (
        f"; snapshots stopped from rank(s) {', '.join(map(str, report.gone))}"
        if report.gone
        else ""
    )
    st.error(
        f"Stalled: no step ended for {report.stalled_s:.0f} s while snapshots kept coming. "
        f"{len(report.blocked)} rank(s) blocked in an op; they wait (through the mesh) for "
        f"rank(s) {roots}{gone}."
    )
    return True


def _stacks(groups: pd.DataFrame | None) -> None:
    """The aggregated stack dumps (``data.stacks.aggregated_stacks``), or why none."""
    st.subheader("Stacks")
    if groups is None:
        st.info("No stack dumps for this run (this store has no stacks table).")
        return
    if groups.empty:
        st.info("No stack dumps for this run (the agent takes them when progress stops).")
        return
    st.caption(
        f"{len(groups)} distinct stack(s) over {int(groups['n_ranks'].sum())} ranks; "
        "fewest ranks first (in a hang the odd group out holds the suspects)."
    )
    for g in groups.itertuples():
        with st.expander(f"{g.n_ranks} ranks: {g.ranks}"):
            st.code(g.stack, language=None)
