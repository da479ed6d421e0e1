"""The mesh picture: the DP x TP x PP grid, each rank colored by slowness, culprits
outlined and wait-for edges drawn from each victim to its culprit."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

CULPRIT = "#d62728"


def grid_xy(ranks: pd.DataFrame, shape: dict[str, int]) -> pd.DataFrame:
    """x, y of each rank: pipeline stages side by side (a gap between them), tensor
    parallel ranks across within a stage (x), data-parallel replicas down (y)."""
    out = ranks.copy()
    out["x"] = out["pp"].astype(int) * (shape["tp"] + 1) + out["tp"].astype(int)
    out["y"] = out["dp"].astype(int)
    return out


def mesh_figure(
    slow: pd.DataFrame, shape: dict[str, int], culprits: list[int], edges: pd.DataFrame
) -> go.Figure:
    """Trace 0: one square per rank (``len(x)`` = ranks), colored by slowness (1 = as
    fast as its same-stage peers); then the edges (victim -> culprit, width by the time
    waited) and the culprit outlines."""
    g = grid_xy(slow, shape)
    world = len(g)
    size = max(6, min(44, int(700 / max(shape["dp"], (shape["tp"] + 1) * shape["pp"], 1))))
    fig = go.Figure(
        go.Scattergl(
            x=g["x"],
            y=g["y"],
            mode="markers" if world > 64 else "markers+text",
            text=[str(int(r)) for r in g["rank"]],
            textfont={"color": "black", "size": 10},
            marker={
                "symbol": "square",
                "size": size,
                "color": g["slowness"].fillna(1.0),
                "colorscale": [[0, "#2c7bb6"], [0.33, "#ffffbf"], [1, "#d7191c"]],
                "cmin": 0.5,
                "cmax": 2.0,
                "colorbar": {"title": {"text": "slowness (x peers)", "side": "right"}},
            },
            customdata=g[["rank", "dp", "tp", "pp", "self_ms", "slowness"]].to_numpy(),
            hovertemplate=(
                "rank %{customdata[0]} (dp %{customdata[1]}, tp %{customdata[2]}, pp %{customdata[3]})"
                "<br>compute %{customdata[4]:.1f} ms/step, %{customdata[5]:.2f}x same-stage peers<extra></extra>"
            ),
            name="ranks",
            showlegend=False,
        )
    )
    _edges(fig, g, edges)
    _culprits(fig, g, culprits, size)
    fig.update_layout(
        height=max(300, min(900, 80 + size * 1.4 * shape["dp"])),
        margin={"l": 10, "r": 10, "t": 40, "b": 40},
        title={
            "text": "mesh: pipeline stages left to right, TP across, DP down",
            "font": {"size": 14},
        },
        xaxis={
            "tickmode": "array",
            "tickvals": _stage_ticks(shape),
            "ticktext": [f"pp{s}" for s in range(shape["pp"])],
            "showgrid": False,
            "zeroline": False,
        },
        yaxis={
            "autorange": "reversed",
            "title": "dp",
            "showgrid": False,
            "zeroline": False,
            "dtick": 1,
        },
    )
    return fig


def _stage_ticks(shape: dict[str, int]) -> list[float]:
    return [s * (shape["tp"] + 1) + (shape["tp"] - 1) / 2 for s in range(shape["pp"])]


def _edges(fig: go.Figure, g: pd.DataFrame, edges: pd.DataFrame) -> None:
    """Each edge as a curved line (so edges along one row stay apart), width by the time
    waited, with a hover point at its middle."""
    if edges.empty:
        return
    at = g.set_index(g["rank"].astype(int))[["x", "y"]]
    top = max(float(edges["waited_ms"].max()), 1e-9)
    mid_x, mid_y, text = [], [], []
    for e in edges.itertuples():
        if e.waiter not in at.index or e.holder not in at.index:
            continue
        (x0, y0), (x1, y1) = at.loc[e.waiter].to_numpy(float), at.loc[e.holder].to_numpy(float)
        cx, cy = (x0 + x1) / 2 + 0.25 * (y1 - y0), (y0 + y1) / 2 - 0.25 * (x1 - x0) - 0.3
        fig.add_shape(
            type="path",
            path=f"M {x0},{y0} Q {cx},{cy} {x1},{y1}",
            line={"color": CULPRIT, "width": 1 + 5 * e.waited_ms / top},
            opacity=0.6,
            layer="below",
        )
        mid_x.append(0.25 * x0 + 0.5 * cx + 0.25 * x1)
        mid_y.append(0.25 * y0 + 0.5 * cy + 0.25 * y1)
        text.append(f"rank {e.waiter} waited {e.waited_ms / 1000:.1f} s for rank {e.holder}")
    fig.add_trace(
        go.Scatter(
            x=mid_x,
            y=mid_y,
            mode="markers",
            marker={"color": CULPRIT, "size": 7},
            hovertext=text,
            hoverinfo="text",
            name="wait-for edges",
            showlegend=False,
        )
    )


def _culprits(fig: go.Figure, g: pd.DataFrame, culprits: list[int], size: int) -> None:
    sub = g[g["rank"].astype(int).isin(culprits)]
    fig.add_trace(
        go.Scatter(
            x=sub["x"],
            y=sub["y"],
            mode="markers",
            name="culprits",
            showlegend=False,
            marker={
                "symbol": "square-open",
                "size": size + 10,
                "color": CULPRIT,
                "line": {"width": 3},
            },
            hovertemplate="culprit<extra></extra>",
        )
    )
