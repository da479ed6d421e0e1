"""The Hosts page's figure: GPU, NIC and host series over time with the run's steps
overlaid."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

GPU_PANELS = (
    ("sm_clock", "SM clock (MHz)"),
    ("power", "power (W)"),
    ("temp", "temperature (°C)"),
    ("nvlink_tx", "NVLink tx (bytes/s)"),
)


PANEL_PX = 200
"""Height of one panel (px)."""
GAP_PX = 50
"""Space between panels (px): the next panel's title sits in it."""
TOP_PX, BOTTOM_PX = 40, 60
"""Room above the first panel (its title) and below the last (ticks, axis title), px."""


def hosts_figure(
    gpu: pd.DataFrame,
    nic: pd.DataFrame,
    host: pd.DataFrame,
    steps: pd.DataFrame,
    t0: int,
    max_step_lines: int = 60,
) -> go.Figure:
    """One panel per GPU series (one line per host and GPU, ``<host> gpu<i>``), one for
    NIC rates (one line per host, device, port and counter) and one for host CPU
    (``cpu <host>``, %); x is seconds since ``t0`` (ns). Step starts are dotted vertical
    lines (every n-th when there are more than ``max_step_lines``). A line that is zero
    (or missing) throughout starts hidden (``visible="legendonly"``: listed greyed in
    the legend, a click shows it; :func:`hidden_count`). Panels are PANEL_PX high with
    GAP_PX between them; the legend is a column right of the panels."""
    panels = [p for p in GPU_PANELS if not gpu.empty and gpu[p[0]].notna().any()]
    titles = [t for _, t in panels] + (["NIC counters (per s)"] if not nic.empty else [])
    titles += ["host CPU (%)"] if not host.empty else []
    n = max(1, len(titles))
    height = TOP_PX + n * PANEL_PX + (n - 1) * GAP_PX + BOTTOM_PX
    fig = make_subplots(
        rows=n,
        cols=1,
        shared_xaxes=True,
        subplot_titles=titles,
        vertical_spacing=GAP_PX / (height - TOP_PX - BOTTOM_PX) if n > 1 else 0.0,
    )
    for i, (col, _) in enumerate(panels, start=1):
        for (name, idx), rows in gpu.groupby(["host", "gpu_index"]):
            line = go.Scatter(
                x=_s(rows, t0),
                y=rows[col],
                mode="lines",
                name=f"{name} gpu{idx}",
                legendgroup=f"{name}/{idx}",
                showlegend=i == 1,
            )
            fig.add_trace(line, row=i, col=1)
    at = len(panels) + 1
    if not nic.empty:
        for key, rows in nic.groupby(["host", "device", "port", "counter"]):
            fig.add_trace(
                go.Scatter(
                    x=_s(rows, t0), y=rows["rate"], mode="lines", name="{} {}:{} {}".format(*key)
                ),
                row=at,
                col=1,
            )
        at += 1
    if not host.empty:
        for name, rows in host.groupby("host"):
            fig.add_trace(
                go.Scatter(x=_s(rows, t0), y=rows["cpu"], mode="lines", name=f"cpu {name}"),
                row=at,
                col=1,
            )
    if not steps.empty:
        every = max(1, len(steps) // max_step_lines)
        for start in steps["t_start"].iloc[::every]:
            fig.add_vline(
                x=(int(start) - t0) / 1e9, line={"color": "#999", "width": 1, "dash": "dot"}
            )
    for trace in fig.data:
        if _flat_zero(trace.y):
            trace.visible = "legendonly"
    fig.update_layout(
        height=height,
        margin={"l": 10, "r": 10, "t": TOP_PX, "b": BOTTOM_PX},
        legend={"orientation": "v", "x": 1.02, "xanchor": "left", "y": 1, "yanchor": "top"},
    )
    fig.update_xaxes(title_text="s (dotted lines: step starts)", row=n, col=1)
    return fig


def hidden_count(fig: go.Figure) -> tuple[int, int]:
    """(lines hidden at first because zero throughout, lines) of a :func:`hosts_figure`."""
    lines = [t for t in fig.data if t.type == "scatter"]
    return sum(t.visible == "legendonly" for t in lines), len(lines)


def _flat_zero(values) -> bool:
    """True when every value is 0 or missing (NaN/None)."""
    arr = pd.to_numeric(pd.Series(values if values is not None else []), errors="coerce")
    return bool(arr.fillna(0).eq(0).all())


def _s(rows: pd.DataFrame, t0: int) -> pd.Series:
    """Seconds since ``t0`` of each row's ``ts`` (ns)."""
    return (rows["ts"] - t0) / 1e9
