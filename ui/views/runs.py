"""Runs: every run with its start, status, world size, mesh, steps, step time, findings;
filter by status and search by run id; pick one to open its overview."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from ranksight.store.url import redact
from ranksight.ui import cache, live
from ranksight.ui.context import PageContext, go
from ranksight.ui.data.runs import STATUSES
from ranksight.ui.guard import NoData


def render(ctx: PageContext) -> None:
    """The Runs page."""
    st.header("Runs")
    left, right = st.columns([2, 3])
    search = left.text_input("Search run id", key="runs_search", placeholder="part of a run id")
    statuses = right.multiselect("Status", STATUSES, default=list(STATUSES), key="runs_status")
    frame = cache.runs_table(ctx.url, search, ctx.cfg.hang_after_s, ctx.cfg.stopped_after_s)
    if frame.empty and not search:
        raise NoData(
            f"No runs in this store yet ({redact(ctx.url)}). Start one with: ranksight demo "
            f"--store {redact(ctx.url)}"
        )
    shown = frame[frame["status"].isin(statuses)]
    st.caption(f"{len(shown)} of {len(frame)} runs" + (f" matching {search!r}" if search else ""))
    if shown.empty:
        st.info("No run matches this search and status filter.")
        return
    table = display_table(shown)
    event = st.dataframe(
        table,
        hide_index=True,
        width="stretch",
        on_select="rerun",
        selection_mode="single-row",
        key="runs_table",
    )
    picked = event.selection.rows if event is not None else []
    if picked:
        row = shown.iloc[picked[0]]
        go(
            ctx.sel,
            page="overview",
            run=str(row["run_id"]),
            attempt=int(row["attempt"]),
            step=None,
            rank=None,
            finding=None,
        )
    st.caption("Select a row to open the run.")
    if (frame["status"] == "running").any():
        live.watch_runs(ctx.url, _run_rows(ctx), ctx.cfg.refresh_s)


def _run_rows(ctx: PageContext) -> int:
    return int(cache.store_for(ctx.url).query("SELECT count() AS n FROM runs")["n"].iloc[0])


def display_table(frame: pd.DataFrame) -> pd.DataFrame:
    """The runs as shown: started (local time), run, attempt, status, world size,
    mesh "dp x tp x pp", steps, step ms, findings."""
    started = pd.to_datetime(frame["started_ns"].astype("int64"), unit="ns", utc=True)
    return pd.DataFrame(
        {
            "started (UTC)": started.dt.strftime("%Y-%m-%d %H:%M:%S"),
            "run": frame["run_id"],
            "attempt": frame["attempt"].astype(int),
            "status": frame["status"],
            "world size": frame["world_size"].astype(int),
            "mesh dp x tp x pp": [
                f"{d} x {t} x {p}"
                for d, t, p in zip(frame["dp"], frame["tp"], frame["pp"], strict=True)
            ],
            "steps": frame["steps"].astype(int),
            "step ms": frame["step_ms"],
            "findings": frame["findings"].astype(int),
        }
    )
