"""The rank x step heatmap figure: culprits marked, hover gives the numbers."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from ranksight.ui.data.heatmap import METRICS, Heatmap

CULPRIT = "#d62728"


def heatmap_figure(
    h: Heatmap, selected_rank: int | None = None, selected_step: int | None = None
) -> go.Figure:
    """Rows are rank bins (top: first in the order), columns step bins; color is the
    largest value in the cell (ms). Culprit rows get a red marker and label on the left;
    the selected rank and step are outlined. Trace 0 is the heatmap (its ``y`` has one
    entry per row), trace 1 the culprit markers."""
    rows, cols = h.shape
    x = np.array(h.col_steps)
    y = np.arange(rows)
    custom = np.dstack([h.vmean_ms, h.worst_rank, h.worst_step]).astype(float)
    step_txt = "step %{x}" if h.step_bin == 1 else f"steps %{{x}}..%{{x}}+{h.step_bin - 1}"
    fig = go.Figure(
        go.Heatmap(
            z=h.vmax_ms,
            x=x,
            y=y,
            customdata=custom,
            colorscale="Viridis",
            colorbar={"title": {"text": "ms"}},
            hovertemplate=(
                "%{text}<br>" + step_txt + "<br>max %{z:.1f} ms, mean %{customdata[0]:.1f} ms"
                "<br>largest: rank %{customdata[1]}, step %{customdata[2]}<extra></extra>"
            ),
            text=np.repeat(np.array(h.row_labels, dtype=object)[:, None], cols, axis=1),
            xgap=0 if cols > 100 else 1,
            ygap=0 if rows > 100 else 1,
        )
    )
    _mark_culprits(fig, h)
    _mark_selection(fig, h, selected_rank, selected_step)
    fig.update_layout(
        title={"text": f"{METRICS[h.metric]} per rank and step (ms)", "font": {"size": 14}},
        height=max(320, min(900, 40 + 14 * rows)),
        margin={"l": 10, "r": 10, "t": 40, "b": 40},
        xaxis={"title": "step"},
        yaxis={
            "autorange": "reversed",
            "tickmode": "array",
            "tickvals": list(y) if rows <= 64 else list(y[:: max(1, rows // 32)]),
            "ticktext": _tick_text(h)[:: 1 if rows <= 64 else max(1, rows // 32)],
        },
        clickmode="event+select",
    )
    return fig


def _mark_culprits(fig: go.Figure, h: Heatmap) -> None:
    """Red triangles just left of the first column on culprit rows (their tick labels
    also say "culprit")."""
    items = sorted(h.culprit_rows.items())
    x0 = h.col_steps[0] - max(1, h.step_bin) * 0.9 if h.col_steps else 0
    fig.add_trace(
        go.Scatter(
            x=[x0] * len(items),
            y=[row for _, row in items],
            mode="markers",
            marker={"symbol": "triangle-right", "size": 14, "color": CULPRIT},
            hovertemplate="culprit: rank %{customdata}<extra></extra>",
            customdata=[rank for rank, _ in items],
            showlegend=False,
            name="culprits",
        )
    )


def _mark_selection(fig: go.Figure, h: Heatmap, rank: int | None, step: int | None) -> None:
    """Outline the selected rank's row and the selected step's column."""
    line = {"color": "white", "width": 2}
    if rank is not None:
        row = next((i for i, rs in enumerate(h.row_ranks) if rank in rs), None)
        if row is not None:
            fig.add_hrect(y0=row - 0.5, y1=row + 0.5, line=line)
    if step is not None and h.step_lo <= step <= h.step_hi:
        col = (step - h.step_lo) // h.step_bin
        x0 = (
            h.col_steps[col] - 0.5 * h.step_bin
            if h.step_bin == 1
            else h.col_steps[col] - h.step_bin / 2
        )
        fig.add_vrect(x0=x0, x1=x0 + h.step_bin, line=line)


def _tick_text(h: Heatmap) -> list[str]:
    """Row labels, culprit rows in red with "culprit" in front."""
    marked = set(h.culprit_rows.values())
    return [
        f'<span style="color:{CULPRIT}">culprit {label}</span>' if i in marked else label
        for i, label in enumerate(h.row_labels)
    ]
