"""The run overview's figure: step time and throughput over steps, culprit onsets marked."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

MARKERS_UP_TO = 120
"""Points per series drawn with markers; longer series are lines only (a marker is an
SVG node each: 1,000 of them cost the browser about 100 ms, bench/RESULTS.md)."""


def overview_figure(series: pd.DataFrame, onsets: dict[int, int]) -> go.Figure:
    """Top: step wall time and the slowest rank's step time (ms); bottom: tokens/s and,
    on a second axis, MFU (%) where known, else the achieved model TFLOP/s where the
    FLOPs per token are known. ``onsets`` maps culprit rank -> onset step, drawn as
    dashed lines. Trace 0 is the step time (one point per step bin)."""
    has_mfu = series["mfu"].notna().any()
    has_tflops = not has_mfu and "tflops" in series and series["tflops"].notna().any()
    fig = make_subplots(
        rows=2,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.08,
        specs=[[{}], [{"secondary_y": True}]],
        subplot_titles=(
            "step time (ms)",
            "throughput (tokens/s)"
            + (" and MFU" if has_mfu else " and model TFLOP/s" if has_tflops else ""),
        ),
    )
    x = series["first_step"]
    mode = "lines+markers" if len(series) <= MARKERS_UP_TO else "lines"
    fig.add_trace(go.Scatter(x=x, y=series["step_ms"], name="step time", mode=mode), row=1, col=1)
    fig.add_trace(
        go.Scatter(
            x=x,
            y=series["slowest_rank_ms"],
            name="slowest rank",
            mode="lines",
            line={"dash": "dot"},
        ),
        row=1,
        col=1,
    )
    fig.add_trace(
        go.Scatter(x=x, y=series["tokens_per_s"], name="tokens/s", mode=mode),
        row=2,
        col=1,
    )
    if has_mfu or has_tflops:
        y, name = (series["mfu"] * 100, "MFU %") if has_mfu else (series["tflops"], "model TFLOP/s")
        fig.add_trace(go.Scatter(x=x, y=y, name=name, mode="lines"), row=2, col=1, secondary_y=True)
    for rank, step in onsets.items():
        fig.add_vline(
            x=step,
            line={"color": "#d62728", "dash": "dash"},
            annotation_text=f"rank {rank} slow from here",
        )
    fig.update_layout(
        height=480,
        margin={"l": 10, "r": 10, "t": 40, "b": 40},
        legend={"orientation": "h", "y": -0.1},
    )
    fig.update_xaxes(title_text="step", row=2, col=1)
    return fig
