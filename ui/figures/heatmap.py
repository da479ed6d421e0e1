"""The rank x step heatmap figure: a rank strip on the left and a step strip below (click
a bar to select that rank or step), culprits in red, hover gives the numbers."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ranksight.ui.data.heatmap import METRICS, Heatmap

CULPRIT = "#d62728"
STRIP = "#8c8c8c"
HEATMAP, RANK_STRIP, STEP_STRIP = 0, 1, 2
"""Trace numbers (a click's ``curve_number``)."""


def heatmap_figure(
    h: Heatmap,
    selected_rank: int | None = None,
    selected_step: int | None = None,
    skip_steps: int = 1,
) -> go.Figure:
    """Rows are rank bins (top: first in the order; ``y`` = row labels), columns step
    bins; color is the largest value in the cell (ms). Trace 0 is the heatmap, trace 1
    the rank strip (per row: mean over steps; customdata: the row's slowest rank), trace
    2 the step strip (per column: largest over ranks; customdata: first step). Culprit
    rows are red in the strip and labelled "culprit"; the selection is outlined. The
    color scale tops out at the largest value after the first ``skip_steps`` steps
    (warm-up steps are slow everywhere and would wash out the rest)."""
    rows, cols = h.shape
    labels = list(h.row_labels)
    fig = make_subplots(
        rows=2,
        cols=2,
        shared_yaxes=True,
        shared_xaxes=True,
        column_widths=[0.1, 0.9],
        row_heights=[0.86, 0.14],
        horizontal_spacing=0.005,
        vertical_spacing=0.02,
    )
    fig.add_trace(_cells(h, labels, _zmax(h, skip_steps)), row=1, col=2)
    fig.add_trace(_rank_strip(h, labels), row=1, col=1)
    fig.add_trace(_step_strip(h), row=2, col=2)
    _mark_selection(fig, h, labels, selected_rank, selected_step)
    every = 1 if rows <= 64 else max(1, rows // 32)
    fig.update_yaxes(
        autorange="reversed",
        type="category",
        categoryorder="array",
        categoryarray=labels,
        tickmode="array",
        tickvals=labels[::every],
        ticktext=_tick_text(h)[::every],
        row=1,
        col=1,
    )
    fig.update_xaxes(autorange="reversed", showticklabels=False, row=1, col=1)
    fig.update_xaxes(title_text="step (click a bar below to select a step)", row=2, col=2)
    fig.update_yaxes(showticklabels=False, row=2, col=2)
    fig.update_yaxes(showticklabels=False, ticks="", row=1, col=2)
    fig.update_layout(
        title={
            "text": f"{METRICS[h.metric]} per rank and step (ms); click a bar left or below to select",
            "font": {"size": 14},
        },
        height=max(380, min(1000, 110 + 14 * rows)),
        margin={"l": 10, "r": 10, "t": 40, "b": 40},
        showlegend=False,
        clickmode="event+select",
        bargap=0.05,
    )
    return fig


def _zmax(h: Heatmap, skip_steps: int) -> float | None:
    """The largest cell value from step ``skip_steps`` on (None: no such cell)."""
    cols = [j for j, s in enumerate(h.col_steps) if s >= skip_steps]
    if not cols or not np.isfinite(h.vmax_ms[:, cols]).any():
        return None
    return float(np.nanmax(h.vmax_ms[:, cols]))


def _cells(h: Heatmap, labels: list[str], zmax: float | None) -> go.Heatmap:
    """The cells as float32 arrays. Hover text is a template over numbers (no string per
    cell); binned cells carry [mean, rank of the largest value] as customdata, unbinned
    ones need none (the row is the rank, the value its own)."""
    rows, cols = h.shape
    binned = h.rank_bin > 1 or h.step_bin > 1
    step_txt = "step %{x}" if h.step_bin == 1 else f"steps %{{x}}..%{{x}}+{h.step_bin - 1}"
    extra = (
        "<br>mean %{customdata[0]:.1f} ms, largest in rank %{customdata[1]:.0f}" if binned else ""
    )
    return go.Heatmap(
        z=h.vmax_ms.astype(np.float32),
        x=np.array(h.col_steps),
        y=labels,
        customdata=np.dstack([h.vmean_ms, h.worst_rank]).astype(np.float32) if binned else None,
        colorscale="Viridis",
        zmin=0 if zmax is not None else None,
        zmax=zmax,
        colorbar={"title": {"text": "ms"}, "len": 0.85, "y": 0.57},
        hovertemplate="%{y}<br>"
        + step_txt
        + "<br>"
        + ("max " if binned else "")
        + "%{z:.1f} ms"
        + extra
        + "<extra></extra>",
        xgap=0 if cols > 100 else 1,
        ygap=0 if rows > 100 else 1,
    )


def _rank_strip(h: Heatmap, labels: list[str]) -> go.Bar:
    with np.errstate(all="ignore"):
        mean = np.nanmean(np.where(np.isnan(h.vmean_ms), np.nan, h.vmean_ms), axis=1)
    worst_col = np.nanargmax(np.nan_to_num(h.vmax_ms, nan=-1.0), axis=1)
    pick = h.worst_rank[np.arange(len(labels)), worst_col]
    pick = np.where(pick >= 0, pick, [r[0] if r else -1 for r in h.row_ranks])
    marked = set(h.culprit_rows.values())
    colors = [CULPRIT if i in marked else STRIP for i in range(len(labels))]
    return go.Bar(
        orientation="h",
        x=np.nan_to_num(mean),
        y=labels,
        customdata=pick,
        marker={"color": colors},
        hovertemplate="%{y}<br>mean %{x:.1f} ms per step<br>click: select rank %{customdata}<extra></extra>",
    )


def _step_strip(h: Heatmap) -> go.Bar:
    peak = (
        np.nanmax(np.nan_to_num(h.vmax_ms, nan=0.0), axis=0) if h.shape[0] else np.zeros(h.shape[1])
    )
    return go.Bar(
        x=np.array(h.col_steps),
        y=peak,
        customdata=np.array(h.col_steps),
        marker={"color": STRIP},
        hovertemplate="step %{x}: largest %{y:.1f} ms<br>click: select this step<extra></extra>",
    )


def _tick_text(h: Heatmap) -> list[str]:
    """Row labels, culprit rows in red with "culprit" in front."""
    marked = set(h.culprit_rows.values())
    return [
        f'<span style="color:{CULPRIT}">culprit {label}</span>' if i in marked else label
        for i, label in enumerate(h.row_labels)
    ]


def _mark_selection(
    fig: go.Figure, h: Heatmap, labels: list[str], rank: int | None, step: int | None
) -> None:
    """Outline the selected rank's row and the selected step's column."""
    line = {"color": "#ff00ff", "width": 3}
    if rank is not None:
        row = next((i for i, rs in enumerate(h.row_ranks) if rank in rs), None)
        if row is not None:
            fig.add_hrect(y0=row - 0.5, y1=row + 0.5, line=line, row=1, col=2)
    if step is not None and h.step_lo <= step <= h.step_hi:
        col = (step - h.step_lo) // h.step_bin
        x0 = h.col_steps[col] - 0.5 if h.step_bin == 1 else h.col_steps[col] - h.step_bin / 2
        fig.add_vrect(x0=x0, x1=x0 + h.step_bin, line=line, row=1, col=2)
