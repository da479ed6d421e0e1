"""The aligned timeline figure: phases and collectives of every drawn rank on one time
axis, with the members of one collective instance linked and its last arriver marked."""

from __future__ import annotations

import math

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


ROW_PX = 30
"""Height of one rank row (px): its label (12 px text) and its bars stay readable."""
TOP_PX = 50
"""Room above the rows for the title (px)."""
AXIS_PX = 70
"""Room below the rows for the x tick labels and the axis title (px)."""
LEGEND_LINE_PX = 22
"""Height of one line of the legend (px); at about 800 px of chart (a 1,280 px window)
a line holds three items, the longest being about 230 px."""
PAST = "past the step's end (cut)"
"""Legend name of the ops drawn to the window's end although they ended later, or never."""


def timeline_figure(
    tl: Timeline, members: pd.DataFrame | None = None, marked: tuple[int, ...] = ()
) -> go.Figure:
    """Horizontal bars per rank (y, in the timeline's rank order, every row labelled,
    ``marked`` ranks' labels in red with a star), each row ROW_PX high: phases full
    height, collectives and send/recv as thin bars on top, those that ran past the
    window's end hatched and cut there; the x axis spans the window (``tl.end_ms``).
    ``members`` (rank, enq_ms) of one collective are joined by a line through their
    arrival (enqueue) times, the last arriver marked red and named in the title. The
    legend sits below the axis title. ``layout.yaxis.categoryarray`` lists the ranks."""
    labels = dict(zip(tl.ranks["rank"].astype(int), tl.ranks["label"], strict=True))
    fig = go.Figure()
    for phase, rows in _groups(tl.phases, "phase"):
        fig.add_trace(
            _bars(rows, labels, phase, PHASE_COLORS.get(phase, "#8c564b"), 0.8, _phase_hover)
        )
    if not tl.collectives.empty:
        _collectives(fig, tl.collectives, labels)
    late = _link(fig, members, labels) if members is not None and not members.empty else ""
    order = list(tl.ranks["label"])
    bottom = AXIS_PX + LEGEND_LINE_PX * math.ceil(len(fig.data) / 3)
    fig.update_layout(
        barmode="overlay",
        height=TOP_PX + ROW_PX * len(order) + bottom,
        margin={"l": 10, "r": 10, "t": TOP_PX, "b": bottom},
        title={
            "text": _title(tl) + late,
            "font": {"size": 14},
            "x": 0.01,
            "y": 0.99,
            "yanchor": "top",
        },
        xaxis={
            "title": "ms since the window's first step start",
            "range": [-0.01 * tl.end_ms, 1.01 * tl.end_ms],
        },
        yaxis={
            "categoryorder": "array",
            "categoryarray": order,
            "autorange": "reversed",
            "type": "category",
            "tickmode": "array",
            "tickvals": order,
            "ticktext": [_tick(r, labels[r], r in marked) for r in labels],
            "automargin": True,
        },
        legend={  # right under the axis title, in the bottom margin kept for it
            "orientation": "h",
            "y": -AXIS_PX / (ROW_PX * max(len(order), 1)),
            "yanchor": "top",
            "x": 0,
            "xanchor": "left",
        },
        dragmode="zoom",
    )
    return fig


def _tick(rank: int, label: str, marked: bool) -> str:
    return f"<span style='color:{LATE}'><b>★ {label}</b></span>" if marked else label


def _collectives(fig: go.Figure, rows: pd.DataFrame, labels: dict) -> None:
    """Collectives and send/recv as thin bars; those that ran past the window's end (or
    never ended) in one hatched grey trace of their own."""
    p2p, past = rows["peer"] >= 0, rows["open"] | (rows["past_ms"] > 0)
    for name, pick, color in (
        ("collectives", ~p2p & ~past, COLLECTIVE_COLOR),
        ("send/recv", p2p & ~past, P2P_COLOR),
    ):
        if pick.any():
            fig.add_trace(_bars(rows[pick], labels, name, color, 0.35, _coll_hover))
    if past.any():
        bars = _bars(rows[past], labels, PAST, COLLECTIVE_COLOR, 0.35, _coll_hover)
        bars.marker.pattern = {"shape": "/", "fgcolor": COLLECTIVE_COLOR, "solidity": 0.5}
        fig.add_trace(bars)


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
        + _done(r)
        + f"<br>{r.bytes / 1e6:.2f} MB"
        for r in rows.itertuples()
    ]


def _done(r) -> str:
    if r.open:
        return "never completed (drawn to the window's end)"
    if r.past_ms > 0:
        return f"done {r.past_ms:.1f} ms after the window's end (cut there)"
    return f"done {r.t1_ms:.1f} ms ({r.t1_ms - r.t0_ms:.1f} ms)"


def _link(fig: go.Figure, members: pd.DataFrame, labels: dict) -> str:
    """The arrival line through one instance's members; the last arriver in red.
    Returns what the title says of it ("" if none of its members is drawn)."""
    shown = members[members["rank"].astype(int).isin(labels)].sort_values("enq_ms")
    if shown.empty:
        return ""
    y = shown["rank"].astype(int).map(labels)
    fig.add_trace(
        go.Scatter(
            x=shown["enq_ms"],
            y=y,
            mode="lines+markers",
            name="chosen collective: arrivals",
            line={"color": "black", "width": 1, "dash": "dot"},
            marker={"color": "black", "size": 7},
            hovertemplate="rank arrived at %{x:.1f} ms<extra></extra>",
        )
    )
    last = members.sort_values("enq_ms").iloc[-1]
    late_ms = float(last["enq_ms"] - members["enq_ms"].min())
    said = f"rank {int(last['rank'])} last, +{late_ms:.1f} ms"
    if int(last["rank"]) not in labels:
        return f"; chosen collective: {said} (not drawn)"
    fig.add_trace(
        go.Scatter(
            x=[last["enq_ms"]],
            y=[labels[int(last["rank"])]],
            mode="markers",
            name="last arriver",
            marker={"color": LATE, "size": 14, "symbol": "star"},
            text=[said],
            hovertemplate="%{text}<extra>last arriver</extra>",
        )
    )
    return f"; chosen collective: {said}"
