"""The app around the pages: page and run pickers in the sidebar, the URL as state,
the store opened once, every page run inside the error guard."""

from __future__ import annotations

import os

import streamlit as st

from ranksight import env
from ranksight.store.url import default_store_url, redact
from ranksight.ui import cache, live
from ranksight.ui.config import UiConfig
from ranksight.ui.context import PageContext, go
from ranksight.ui.data.run import data_watermark
from ranksight.ui.guard import NoData, page_guard
from ranksight.ui.state import PAGES, Selection, parse_selection
from ranksight.ui.views import hang, heatmap, hosts, mesh, overview, runs, timeline

VIEWS = {
    "runs": runs,
    "overview": overview,
    "heatmap": heatmap,
    "timeline": timeline,
    "mesh": mesh,
    "hang": hang,
    "hosts": hosts,
}


def store_url() -> str:
    """The store the UI reads: ``$RANKSIGHT_STORE`` (set by ``ranksight ui --store``),
    else the default store."""
    return os.environ.get(env.STORE) or default_store_url()


def main(cfg: UiConfig | None = None) -> None:
    """Draw the app for the current URL."""
    st.set_page_config(page_title="ranksight", layout="wide")
    cfg = cfg or UiConfig()
    url = store_url()
    sel = parse_selection(st.query_params.to_dict())
    for problem in sel.problems:
        st.warning(problem)
    _page_picker(sel)
    st.sidebar.caption(f"store: {redact(url)}")
    with page_guard(url):
        ctx = _context(url, cfg, sel)
        VIEWS[sel.page].render(ctx)
        if ctx.run is not None and ctx.status == "running":
            live.watch(url, ctx.run, ctx.mark, cfg.refresh_s)


def _page_picker(sel: Selection) -> None:
    st.sidebar.title("ranksight")
    keys = list(PAGES)
    page = st.sidebar.radio("Page", keys, index=keys.index(sel.page), format_func=PAGES.get)
    if page != sel.page:
        go(sel, page=page, finding=None)


def _context(url: str, cfg: UiConfig, sel: Selection) -> PageContext:
    """The page context: the run picked in the sidebar (default: the newest) with its
    status and data watermark. Raises NoData for an empty store, UnknownRun, StoreError."""
    table = cache.runs_table(url, "", cfg.hang_after_s)
    if sel.page == "runs":
        return PageContext(url, cfg, sel)
    if table.empty:
        raise NoData(
            f"No runs in this store yet ({redact(url)}). Start one with: ranksight demo --store {redact(url)}"
        )
    run_ids = list(dict.fromkeys(table["run_id"]))
    if sel.run is not None and sel.run not in run_ids:
        run_ids.insert(0, sel.run)  # shown, then reported as unknown by load_run_view
    current = sel.run or run_ids[0]
    picked = st.sidebar.selectbox("Run", run_ids, index=run_ids.index(current))
    if picked != sel.run:
        go(sel, run=picked, attempt=None, step=None, rank=None, finding=None)
    view = cache.run_view(url, picked, sel.attempt)
    mine = table[(table["run_id"] == view.run_id) & (table["attempt"] == view.attempt)]
    status = str(mine["status"].iloc[0]) if len(mine) else str(view.row.get("status", ""))
    st.sidebar.caption(f"attempt {view.attempt}, {status}, {len(view.ranks)} ranks")
    mark = data_watermark(cache.store_for(url), view)
    return PageContext(url, cfg, sel, view, mark, status)
