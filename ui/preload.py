"""Start loading the page's charting library in the browser while the server reads the
store.

Streamlit's browser side fetches and evaluates a chart library (Plotly: a 4.7 MB script,
0.8-1.5 s in a fresh tab of headless Chromium on a 2-core machine; ECharts: 1.2 MB,
bench/RESULTS.md) only when the first chart element of that library reaches it. A page
that queried first and charted last paid both, one after the other. A small placeholder
chart of the page's library, sent before the page's first query, lets the browser load
it while the server works; the placeholder goes when the page is drawn.
"""

from __future__ import annotations

import functools

import plotly.graph_objects as go
import streamlit as st

ECHARTS_PAGES = frozenset({"overview", "heatmap"})
"""Pages whose charts are ECharts (``st.echarts_chart``)."""
PLOTLY_PAGES = frozenset({"timeline", "mesh", "hosts"})
"""Pages whose charts are Plotly (``st.plotly_chart``)."""
CHART_PAGES = ECHARTS_PAGES | PLOTLY_PAGES
"""Pages that draw a chart."""
LOADING = "loading charts ..."
HEIGHT = 36
"""The placeholder's height (px)."""


@functools.cache
def _placeholder() -> go.Figure:
    """A 36 px Plotly strip saying the charts are loading (built once per server)."""
    hidden = {"visible": False}
    return go.Figure(
        layout={
            "height": HEIGHT,
            "margin": {"l": 0, "r": 0, "t": 0, "b": 0},
            "xaxis": hidden,
            "yaxis": hidden,
            "annotations": [{"text": LOADING, "showarrow": False, "font": {"color": "#888"}}],
        }
    )


def echarts_placeholder() -> dict:
    """The ECharts option of the same strip (a title, no series)."""
    return {
        "animation": False,
        "title": {
            "text": LOADING,
            "left": "center",
            "top": "middle",
            "textStyle": {"color": "#888", "fontSize": 12, "fontWeight": "normal"},
        },
        "series": [],
    }


def start(page: str):
    """For a page in :data:`CHART_PAGES`, an ``st.empty`` slot holding the placeholder
    chart of the page's library (drawn where the call is made: put it below the page's
    own container so the page does not move when it goes); None for other pages."""
    if page not in CHART_PAGES:
        return None
    slot = st.empty()
    if page in ECHARTS_PAGES:
        slot.echarts_chart(echarts_placeholder(), height=HEIGHT, key="chart_preload")
    else:
        slot.plotly_chart(_placeholder(), key="chart_preload", config={"staticPlot": True})
    return slot


def finish(slot) -> None:
    """Remove the placeholder of :func:`start` (None: nothing to do)."""
    if slot is not None:
        slot.empty()
