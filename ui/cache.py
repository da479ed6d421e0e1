"""Cached reads for the pages: one store per URL per server, and query results keyed on
the run's data watermark, so a rerun (a click, a refresh with no new data) costs no
query while new steps are picked up at once."""

from __future__ import annotations

import streamlit as st

from ranksight.store import Store, open_store
from ranksight.ui.data import hang, heatmap, mesh, overview, runs, timeline
from ranksight.ui.data.run import RunView, load_run_view


@st.cache_resource(show_spinner=False)
def store_for(url: str) -> Store:
    """The store at ``url``, opened once per server process. Raises StoreError."""
    return open_store(url)


def _store(url: str) -> Store:
    return store_for(url)


@st.cache_data(ttl=2, show_spinner=False, max_entries=16)
def runs_table(url: str, search: str, hang_after_s: float):
    """``data.runs.runs_table`` (refreshed every 2 s)."""
    return runs.runs_table(_store(url), search, hang_after_s=hang_after_s)


@st.cache_data(ttl=2, show_spinner=False, max_entries=32)
def run_view(url: str, run_id: str, attempt: int | None) -> RunView:
    """``data.run.load_run_view`` (refreshed every 2 s: status and findings change)."""
    return load_run_view(_store(url), run_id, attempt)


@st.cache_data(ttl=600, show_spinner=False, max_entries=32)
def step_range(url: str, run: RunView, mark: tuple):
    """``data.heatmap.step_range`` at watermark ``mark``."""
    return heatmap.step_range(_store(url), run)


@st.cache_data(ttl=600, show_spinner=False, max_entries=32)
def heatmap_cells(
    url: str,
    run: RunView,
    mark: tuple,
    metric: str,
    order: tuple,
    steps: tuple,
    rows: int,
    cols: int,
):
    """``data.heatmap.load_heatmap`` at watermark ``mark``."""
    return heatmap.load_heatmap(_store(url), run, metric, order, steps, rows, cols)


@st.cache_data(ttl=600, show_spinner=False, max_entries=32)
def step_series(url: str, run: RunView, mark: tuple, points: int):
    """``data.overview.step_series`` at watermark ``mark``."""
    return overview.step_series(_store(url), run, points)


@st.cache_data(ttl=600, show_spinner=False, max_entries=32)
def timeline_rows(
    url: str, run: RunView, mark: tuple, steps: tuple, order: tuple, center: int | None, ranks: int
):
    """``data.timeline.load_timeline`` at watermark ``mark``."""
    return timeline.load_timeline(_store(url), run, steps, order, center, ranks)


@st.cache_data(ttl=600, show_spinner=False, max_entries=32)
def instances(url: str, run: RunView, mark: tuple, steps: tuple):
    """``data.timeline.collective_instances`` at watermark ``mark``."""
    return timeline.collective_instances(_store(url), run, steps)


@st.cache_data(ttl=600, show_spinner=False, max_entries=64)
def members(url: str, run: RunView, group_id: str, group_seq: int, origin_ns: int):
    """``data.timeline.instance_members``."""
    return timeline.instance_members(_store(url), run, group_id, group_seq, origin_ns)


@st.cache_data(ttl=600, show_spinner=False, max_entries=32)
def slowness(url: str, run: RunView, mark: tuple, skip_steps: int):
    """``data.mesh.slowness`` at watermark ``mark``."""
    return mesh.slowness(_store(url), run, skip_steps)


@st.cache_data(ttl=5, show_spinner=False, max_entries=32)
def group_progress(url: str, run: RunView):
    """``data.hang.group_progress`` (refreshed every 5 s)."""
    return hang.group_progress(_store(url), run)
