"""The app around the pages: page and run pickers in the sidebar, the URL as state,
the store opened once, every page run inside the error guard, the page's chart library
loading in the browser while the page queries (``preload``)."""

from __future__ import annotations

import os
import time

import streamlit as st

from ranksight.analyzer.queries import resolve_attempt
from ranksight.ground import env
from ranksight.ground.vocab import Kind
from ranksight.store.url import default_store_url, redact
from ranksight.ui import cache, live, preload, warm
from ranksight.ui.config import UiConfig
from ranksight.ui.context import PageContext, go
from ranksight.ui.data.runs import run_status, stopped_reporting
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
    warm.start(url, cfg)  # once per server: the newest runs' reads, in the background
    sel = parse_selection(st.query_params.to_dict())
    body = st.container()
    loading = preload.start(sel.page)  # below the page: its chart library loads while we query
    for problem in sel.problems:
        body.warning(problem)
    _page_picker(sel)
    st.sidebar.caption(f"store: {redact(url)}")
    with body, page_guard(url):
        ctx = _context(url, cfg, sel)
        VIEWS[sel.page].render(ctx)
        if ctx.run is not None and ctx.status in ("running", "hung", "stopped"):
            _watch_or_say_stopped(url, cfg, ctx, sel.page == "hang")
    preload.finish(loading)


def _watch_or_say_stopped(url: str, cfg: UiConfig, ctx: PageContext, hang_page: bool) -> None:
    """A run with no end recorded: watched live while it reports, else (nothing from it
    for ``cfg.stopped_after_s``) said to have stopped reporting, and not watched."""
    last = _last_record_ns(url, ctx)
    if stopped_reporting(last, time.time_ns(), cfg.stopped_after_s):
        live.say_stopped(last, time.time_ns())
        return
    probe = (lambda: cache.progress_newest(url, ctx.selected_run)) if hang_page else None
    live.watch(url, ctx.selected_run, ctx.mark, cfg.refresh_s, probe)


def _last_record_ns(url: str, ctx: PageContext) -> int:
    """The run's newest record (ns): last step end, run row update or progress snapshot."""
    return max(
        ctx.mark.last_end_ns, ctx.mark.updated_ns, cache.progress_newest(url, ctx.selected_run)
    )


def _page_picker(sel: Selection) -> None:
    st.sidebar.title("ranksight")
    keys = list(PAGES)
    page = st.sidebar.radio("Page", keys, index=keys.index(sel.page), format_func=PAGES.get)
    if page != sel.page:
        go(sel, page=page, finding=None)


def _context(url: str, cfg: UiConfig, sel: Selection) -> PageContext:
    """The page context: the run picked in the sidebar (default: the newest) with its
    data version and status. Costs one small query (the mark) when nothing changed.
    Raises NoData for an empty store, UnknownRun, StoreError."""
    if sel.page == "runs":
        return PageContext(url, cfg, sel)
    listed = cache.run_list(url)
    if listed.empty:
        raise NoData(
            f"No runs in this store yet ({redact(url)}). Start one with: ranksight demo --store {redact(url)}"
        )
    run_ids = list(dict.fromkeys(listed["run_id"]))
    if sel.run is not None and sel.run not in run_ids:
        run_ids.insert(0, sel.run)  # shown, then reported as unknown below
    current = sel.run or run_ids[0]
    picked = st.sidebar.selectbox("Run", run_ids, index=run_ids.index(current))
    if picked != sel.run:
        go(sel, run=picked, attempt=None, step=None, rank=None, finding=None)
    row, attempt = _attempt(url, listed, picked, sel.attempt)
    mark = cache.run_mark(url, picked, attempt)
    view = cache.run_view(url, picked, attempt, mark)
    hangs = sum(f.kind == Kind.HANG for f in view.findings)
    status = run_status(
        str(row["stored_status"]),
        max(mark.last_end_ns, mark.updated_ns),
        mark.mean_step_ns,
        hangs,
        time.time_ns(),
        cfg.hang_after_s,
        last_record_ns=cache.progress_newest(url, view),
        stopped_after_s=cfg.stopped_after_s,
    )
    st.sidebar.caption(f"attempt {view.attempt}, {status}, {len(view.ranks)} ranks")
    return PageContext(url, cfg, sel, view, mark, status)


def _attempt(url: str, listed, run_id: str, attempt: int | None) -> tuple[dict, int]:
    """The run list's row for ``run_id`` (the latest attempt unless ``attempt``) and its
    attempt. Raises UnknownRun (naming the runs that exist) if there is none."""
    mine = listed[listed["run_id"] == run_id]
    if attempt is not None:
        mine = mine[mine["attempt"] == attempt]
    if mine.empty:  # not listed (yet): the analyzer's own lookup, or its message
        row, found = resolve_attempt(cache.store_for(url), run_id, attempt)
        return {**row, "stored_status": str(row.get("status", ""))}, found
    row = mine.sort_values("attempt").iloc[-1].to_dict()
    return row, int(row["attempt"])
