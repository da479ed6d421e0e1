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
    lines (every n-th when there are more than ``max_step_lines``)."""
    panels = [p for p in GPU_PANELS if not gpu.empty and gpu[p[0]].notna().any()]
    titles = [t for _, t in panels] + (["NIC counters (per s)"] if not nic.empty else [])
    titles += ["host CPU (%)"] if not host.empty else []
    fig = make_subplots(
        rows=max(1, len(titles)),
        cols=1,
        shared_xaxes=True,
        subplot_titles=titles,
        vertical_spacing=0.06,
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
    fig.update_layout(
        height=max(300, 220 * len(titles)),
        margin={"l": 10, "r": 10, "t": 40, "b": 40},
        legend={"orientation": "h"},
    )
    fig.update_xaxes(title_text="s (dotted lines: step starts)", row=max(1, len(titles)), col=1)
    return fig


def _s(rows: pd.DataFrame, t0: int) -> pd.Series:
    """Seconds since ``t0`` of each row's ``ts`` (ns)."""
    return (rows["ts"] - t0) / 1e9
