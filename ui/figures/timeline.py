"""The aligned timeline figure: phases and collectives of every drawn rank on one time
axis, with the members of one collective instance linked and its last arriver marked."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from ranksight.ui.data.timeline import Timeline

PHASE_COLORS = {
    "data_wait": "#bcbd22",
    "forward": "#1f77b4",
    "backward": "#ff7f0e",
    "optimizer": "#2ca02c",
    "checkpoint": "#9467bd",
    "gc": "#e377c2",
}
COLLECTIVE_COLOR = "#7f7f7f"
P2P_COLOR = "#17becf"
LATE = "#d62728"


def timeline_figure(tl: Timeline, members: pd.DataFrame | None = None) -> go.Figure:
    """Horizontal bars per rank (y, in the timeline's rank order): phases full height,
    collectives and send/recv as thin bars on top; ``members`` (rank, enq_ms) of one
    collective are joined by a line through their arrival (enqueue) times, the last
    arriver marked red. ``layout.yaxis.categoryarray`` lists the drawn ranks."""
    labels = dict(zip(tl.ranks["rank"].astype(int), tl.ranks["label"], strict=True))
    fig = go.Figure()
    for phase, rows in _groups(tl.phases, "phase"):
        fig.add_trace(
            _bars(rows, labels, phase, PHASE_COLORS.get(phase, "#8c564b"), 0.8, _phase_hover)
        )
    if not tl.collectives.empty:
        p2p = tl.collectives["peer"] >= 0
        for name, rows, color in (
            ("collectives", tl.collectives[~p2p], COLLECTIVE_COLOR),
            ("send/recv", tl.collectives[p2p], P2P_COLOR),
        ):
            if not rows.empty:
                fig.add_trace(_bars(rows, labels, name, color, 0.35, _coll_hover))
    if members is not None and not members.empty:
        _link(fig, members, labels)
    order = list(tl.ranks["label"])
    fig.update_layout(
        barmode="overlay",
        height=max(300, min(1400, 60 + 22 * len(order))),
        margin={"l": 10, "r": 10, "t": 40, "b": 40},
        title={"text": _title(tl), "font": {"size": 14}},
        xaxis={"title": "ms since the window's first step start"},
        yaxis={
            "categoryorder": "array",
            "categoryarray": order,
            "autorange": "reversed",
            "type": "category",
        },
        legend={"orientation": "h", "y": 1.0, "yanchor": "bottom", "x": 0.3},
        dragmode="zoom",
    )
    return fig


def _title(tl: Timeline) -> str:
    lo, hi = tl.steps
    what = f"step {lo}" if lo == hi else f"steps {lo}..{hi}"
    return f"{what}: {len(tl.ranks)} ranks on one time axis"


def _groups(frame: pd.DataFrame, key: str):
    return [] if frame.empty else frame.groupby(key, sort=False)


def _bars(rows: pd.DataFrame, labels: dict, name: str, color: str, width: float, hover) -> go.Bar:
    return go.Bar(
        orientation="h",
        base=rows["t0_ms"],
        x=(rows["t1_ms"] - rows["t0_ms"]).clip(lower=0.001),
        y=rows["rank"].astype(int).map(labels),
        width=width,
        name=name,
        marker={"color": color, "line": {"width": 0}},
        hovertext=hover(rows),
        hoverinfo="text",
    )


def _phase_hover(rows: pd.DataFrame) -> list[str]:
    return [
        f"rank {r.rank} {r.phase}"
        + (f" mb {r.microbatch}" if r.microbatch >= 0 else "")
        + f"<br>{r.t0_ms:.1f} .. {r.t1_ms:.1f} ms ({r.t1_ms - r.t0_ms:.1f} ms)"
        + f"<br>blocked on collectives {r.wait_ns / 1e6:.1f} ms"
        for r in rows.itertuples()
    ]


def _coll_hover(rows: pd.DataFrame) -> list[str]:
    return [
        f"rank {r.rank} {r.op}"
        + (f" peer {r.peer}" if r.peer >= 0 else "")
        + f" {r.group_id}#{r.group_seq}<br>issued {r.enq_ms:.1f} ms, "
        + ("never completed" if r.open else f"done {r.t1_ms:.1f} ms ({r.t1_ms - r.t0_ms:.1f} ms)")
        + f"<br>{r.bytes / 1e6:.2f} MB"
        for r in rows.itertuples()
    ]


def _link(fig: go.Figure, members: pd.DataFrame, labels: dict) -> None:
    """The arrival line through one instance's members; the last arriver in red."""
    shown = members[members["rank"].astype(int).isin(labels)].sort_values("enq_ms")
    if shown.empty:
        return
    y = shown["rank"].astype(int).map(labels)
    fig.add_trace(
        go.Scatter(
            x=shown["enq_ms"],
            y=y,
            mode="lines+markers",
            name="arrivals of the chosen collective",
            line={"color": "black", "width": 1, "dash": "dot"},
            marker={"color": "black", "size": 7},
            hovertemplate="rank arrived at %{x:.1f} ms<extra></extra>",
        )
    )
    last = members.sort_values("enq_ms").iloc[-1]
    if int(last["rank"]) in labels:
        late_ms = float(last["enq_ms"] - members["enq_ms"].min())
        fig.add_trace(
            go.Scatter(
                x=[last["enq_ms"]],
                y=[labels[int(last["rank"])]],
                mode="markers+text",
                name="last arriver",
                marker={"color": LATE, "size": 14, "symbol": "star"},
                text=[f"rank {int(last['rank'])} last, +{late_ms:.1f} ms"],
                textposition="top center",
                textfont={"color": LATE},
                hovertemplate="last arriver<extra></extra>",
            )
        )
