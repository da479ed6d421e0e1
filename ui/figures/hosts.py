"""The Hosts page's figure: GPU and NIC series over time with the run's steps overlaid."""

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
    gpu: pd.DataFrame, nic: pd.DataFrame, steps: pd.DataFrame, t0: int, max_step_lines: int = 60
) -> go.Figure:
    """One panel per GPU series (one line per host and GPU) and one for NIC rates (one
    line per host, device, port and counter); x is seconds since ``t0`` (ns). Step
    starts are dotted vertical lines (every n-th when there are more than
    ``max_step_lines``)."""
    panels = [p for p in GPU_PANELS if not gpu.empty and gpu[p[0]].notna().any()]
    titles = [t for _, t in panels] + (["NIC counters (per s)"] if not nic.empty else [])
    fig = make_subplots(
        rows=max(1, len(titles)),
        cols=1,
        shared_xaxes=True,
        subplot_titles=titles,
        vertical_spacing=0.06,
    )
    for i, (col, _) in enumerate(panels, start=1):
        for (host, idx), rows in gpu.groupby(["host", "gpu_index"]):
            fig.add_trace(
                go.Scatter(
                    x=(rows["ts"] - t0) / 1e9,
                    y=rows[col],
                    mode="lines",
                    name=f"{host} gpu{idx}",
                    legendgroup=f"{host}/{idx}",
                    showlegend=i == 1,
                ),
                row=i,
                col=1,
            )
    if not nic.empty:
        for key, rows in nic.groupby(["host", "device", "port", "counter"]):
            fig.add_trace(
                go.Scatter(
                    x=(rows["ts"] - t0) / 1e9,
                    y=rows["rate"],
                    mode="lines",
                    name="{} {}:{} {}".format(*key),
                ),
                row=len(titles),
                col=1,
            )
    if not steps.empty:
        every = max(1, len(steps) // max_step_lines)
        for r in steps.iloc[::every].itertuples():
            fig.add_vline(
                x=(r.t_start - t0) / 1e9, line={"color": "#999", "width": 1, "dash": "dot"}
            )
    fig.update_layout(
        height=max(300, 220 * len(titles)),
        margin={"l": 10, "r": 10, "t": 40, "b": 40},
        legend={"orientation": "h"},
    )
    fig.update_xaxes(title_text="s (dotted lines: step starts)", row=max(1, len(titles)), col=1)
    return fig
