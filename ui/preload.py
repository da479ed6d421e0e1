"""Start loading the charting library in the browser while the server reads the store.

Streamlit's browser side fetches and evaluates Plotly (a 4.7 MB script: 0.8-1.5 s in a
fresh tab of headless Chromium on a 2-core machine, bench/RESULTS.md) only when the
first chart element reaches it. A page that queried first and charted last paid both,
one after the other. A small placeholder chart sent before the page's first query lets
the browser load Plotly while the server works; the placeholder goes when the page is
drawn.
"""

from __future__ import annotations

import functools

import plotly.graph_objects as go
import streamlit as st

CHART_PAGES = frozenset({"overview", "heatmap", "timeline", "mesh", "hosts"})
"""Pages that draw a Plotly chart."""


@functools.cache
def _placeholder() -> go.Figure:
    """A 36 px strip saying the charts are loading (built once per server)."""
    hidden = {"visible": False}
    return go.Figure(
        layout={
            "height": 36,
            "margin": {"l": 0, "r": 0, "t": 0, "b": 0},
            "xaxis": hidden,
            "yaxis": hidden,
            "annotations": [
                {"text": "loading charts ...", "showarrow": False, "font": {"color": "#888"}}
            ],
        }
    )


def start(page: str):
    """For a page in :data:`CHART_PAGES`, an ``st.empty`` slot holding the placeholder
    chart (drawn where the call is made: put it below the page's own container so the
    page does not move when it goes); None for other pages."""
    if page not in CHART_PAGES:
        return None
    slot = st.empty()
    slot.plotly_chart(_placeholder(), key="chart_preload", config={"staticPlot": True})
    return slot


def finish(slot) -> None:
    """Remove the placeholder of :func:`start` (None: nothing to do)."""
    if slot is not None:
        slot.empty()
