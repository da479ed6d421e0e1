"""Cached reads for the pages: one store per URL per server, and query results keyed on
the run's identity and data version (``data.run.RunMark``: step rows, last step end,
latest analysis, run row update), so a page load or a click with no new data costs one
small query (the mark) while a running job's new steps show at once. A run view is
hashed by its (run_id, attempt) alone: its contents are what the mark versions."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import streamlit as st

from ranksight.store import Store, open_store
from ranksight.ui.data import hang, heatmap, mesh, onsets, overview, runs, timeline
from ranksight.ui.data.run import MARK_TABLES, RunMark, RunView, data_watermark, load_run_view


def _run_key(run: RunView) -> tuple[str, int]:
    return run.run_id, run.attempt


_KEYS: dict[str | type[Any], Callable[[Any], Any]] = {RunView: _run_key}
"""How cached reads hash a run view (the mark argument carries its version)."""


@st.cache_resource(show_spinner=False)
def store_for(url: str) -> Store:
    """The store at ``url``, opened once per server process. Raises StoreError."""
    return open_store(url)


def _store(url: str) -> Store:
    return store_for(url)


@st.cache_data(ttl=2, show_spinner=False, max_entries=16)
def runs_table(url: str, search: str, hang_after_s: float, stopped_after_s: float):
    """``data.runs.runs_table`` (refreshed every 2 s)."""
    return runs.runs_table(
        _store(url), search, hang_after_s=hang_after_s, stopped_after_s=stopped_after_s
    )


@st.cache_data(ttl=2, show_spinner=False, max_entries=4)
def run_list(url: str):
    """``data.runs.run_list`` (refreshed every 2 s: new runs show up)."""
    return runs.run_list(_store(url))


def run_mark(url: str, run_id: str, attempt: int) -> RunMark:
    """The run attempt's data version (``data.run.data_watermark``). Where the store can
    say cheaply whether its tables changed (``Store.tables_version``: chdb folders), the
    mark is read once per version of those tables; else (a ClickHouse server) it is one
    small query each call. Raises StoreError."""
    version = _store(url).tables_version(MARK_TABLES)
    if version is None:
        return data_watermark(_store(url), run_id, attempt)
    return _mark_at(url, run_id, attempt, version)


@st.cache_data(show_spinner=False, max_entries=64)
def _mark_at(url: str, run_id: str, attempt: int, version) -> RunMark:
    """``data.run.data_watermark`` at tables version ``version``."""
    return data_watermark(_store(url), run_id, attempt)


@st.cache_data(show_spinner=False, max_entries=32)
def run_view(url: str, run_id: str, attempt: int, mark: RunMark) -> RunView:
    """``data.run.load_run_view`` at data version ``mark``."""
    return load_run_view(_store(url), run_id, attempt)


def step_range(url: str, run: RunView, mark: RunMark):
    """``data.heatmap.step_range``, as the mark already read it (no query)."""
    return mark.steps


@st.cache_data(ttl=600, show_spinner=False, max_entries=32, hash_funcs=_KEYS)
def heatmap_cells(
    url: str,
    run: RunView,
    mark: RunMark,
    metric: str,
    order: tuple,
    steps: tuple,
    rows: int,
    cols: int,
):
    """``data.heatmap.load_heatmap`` at watermark ``mark``."""
    return heatmap.load_heatmap(_store(url), run, metric, order, steps, rows, cols)


@st.cache_data(ttl=600, show_spinner=False, max_entries=32, hash_funcs=_KEYS)
def step_series(url: str, run: RunView, mark: RunMark, points: int):
    """``data.overview.step_series`` at watermark ``mark``."""
    return overview.step_series(_store(url), run, points)


@st.cache_data(ttl=600, show_spinner=False, max_entries=32, hash_funcs=_KEYS)
def last_steps(url: str, run: RunView, mark: RunMark):
    """``data.onsets.last_steps`` at watermark ``mark``."""
    return onsets.last_steps(_store(url), run)


@st.cache_data(ttl=600, show_spinner=False, max_entries=32, hash_funcs=_KEYS)
def timeline_rows(
    url: str,
    run: RunView,
    mark: RunMark,
    steps: tuple,
    order: tuple,
    center: int | None,
    ranks: int,
):
    """``data.timeline.load_timeline`` at watermark ``mark``."""
    return timeline.load_timeline(_store(url), run, steps, order, center, ranks)


@st.cache_data(ttl=600, show_spinner=False, max_entries=32, hash_funcs=_KEYS)
def instances(url: str, run: RunView, mark: RunMark, steps: tuple):
    """``data.timeline.collective_instances`` at watermark ``mark``."""
    return timeline.collective_instances(_store(url), run, steps)


@st.cache_data(ttl=600, show_spinner=False, max_entries=64, hash_funcs=_KEYS)
def members(url: str, run: RunView, group_id: str, group_seq: int, origin_ns: int):
    """``data.timeline.instance_members``."""
    return timeline.instance_members(_store(url), run, group_id, group_seq, origin_ns)


@st.cache_data(ttl=600, show_spinner=False, max_entries=32, hash_funcs=_KEYS)
def slowness(url: str, run: RunView, mark: RunMark, skip_steps: int):
    """``data.mesh.slowness`` at watermark ``mark``."""
    return mesh.slowness(_store(url), run, skip_steps)


@st.cache_data(ttl=600, show_spinner=False, max_entries=32, hash_funcs=_KEYS)
def group_progress(url: str, run: RunView, mark: RunMark):
    """``data.hang.group_progress`` (from collective rows) at watermark ``mark``."""
    return hang.group_progress(_store(url), run)


def progress_newest(url: str, run: RunView) -> int:
    """``data.hang.progress_newest`` (not cached: it is the key of the snapshot reads)."""
    return hang.progress_newest(_store(url), run)


@st.cache_data(ttl=600, show_spinner=False, max_entries=16, hash_funcs=_KEYS)
def hang_snapshots(url: str, run: RunView, mark: RunMark, newest_ns: int):
    """``data.hang.load_snapshots`` as of the newest snapshot ``newest_ns``, with its
    progress and open ops settled against the collective rows (``data.hang.settle``)."""
    snap = hang.load_snapshots(_store(url), run)
    if snap.progress.empty:
        return snap
    progress, open_by_rank = hang.settle(_store(url), run, snap)
    return replace(snap, progress=progress, open_by_rank=open_by_rank)
