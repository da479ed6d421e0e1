"""The rank x step heatmap as an ECharts option (``st.echarts_chart``): a rank strip on
the left and a step strip below (click a cell or a bar to select that rank or step),
culprits in red, hover gives the numbers.

ECharts rather than Plotly: a fresh browser tab evaluates Streamlit's ECharts bundle
(1.2 MB) about 0.7 s sooner than its Plotly bundle (4.7 MB) on a 2-core machine
(bench/RESULTS.md, "the floor"), which is most of the page's first render.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ranksight.ui.data.heatmap import METRICS, Heatmap
from ranksight.ui.figures.dataset import json_dataset

CULPRIT = "#d62728"
STRIP = "#8c8c8c"
SELECTED = "#ff00ff"
HEATMAP, RANK_STRIP, STEP_STRIP, SELECTION = 0, 1, 2, 3
"""Series indices (a selection's ``series_index``)."""

VIRIDIS = ["#440154", "#482878", "#3e4989", "#31688e", "#26828e"]
VIRIDIS += ["#1f9e89", "#35b779", "#6ece58", "#b5de2b", "#fde725"]
"""Plotly's Viridis color scale, low to high."""

TOP, LABELS, STRIP_W, RIGHT, STRIP_H, BOTTOM, GAP = 40, 190, 80, 110, 60, 40, 8
"""Layout in px: title band; the rank labels' width, then the rank strip's; the color
bar's band on the right (the bar, its handles and their labels right of it); the step
strip's height; the axis band below it; the gap between the strips and the cells. The cells span x from LABELS + STRIP_W + GAP to
width - RIGHT and y from TOP to height - (BOTTOM + STRIP_H + GAP)."""

CELL_COLUMNS = ("row", "col", "max ms", "mean ms", "largest in rank", "step")
"""The cells' dataset columns (unbinned cells have no mean and rank)."""


def chart_height(rows: int) -> int:
    """The chart's height in px for ``rows`` rank rows (380-1000, 14 px a row)."""
    return max(380, min(1000, 110 + 14 * rows))


def heatmap_figure(
    h: Heatmap,
    selected_rank: int | None = None,
    selected_step: int | None = None,
    skip_steps: int = 1,
) -> dict:
    """The ECharts option. Series 0 is the heatmap: one row of ``dataset[0]`` per cell,
    row-major (cell (i, j) is row ``i * cols + j``), columns :data:`CELL_COLUMNS`: the
    row and column index, the cell's largest value (ms, rounded to 0.01 ms; null where
    empty), when binned the mean (ms) and the rank of the largest value, and the
    column's first step. Series 1 is the rank strip (per row: ``[mean over
    steps (ms), row, the row's slowest rank, label]``; culprit rows red), series 2 the
    step strip (per column: ``[column, largest over ranks (ms), first step]``), series
    3 has no points, only the selection's outline. Row 0 is at the top. Culprit rows' axis labels
    read "culprit ..." in red; the selected rank's row and step's column are outlined. The color scale tops out at the largest
    value after the first ``skip_steps`` steps (warm-up steps are slow everywhere and
    would wash out the rest). Clicks select a cell or bar (``selectedMode``)."""
    rows, cols = h.shape
    ticks = _tick_labels(h)
    marked = set(h.culprit_rows.values())
    steps = [str(s) for s in h.col_steps]
    zmax = _zmax(h, skip_steps)
    cells_left = LABELS + STRIP_W + GAP
    cells_bottom = BOTTOM + STRIP_H + GAP
    every = 0 if rows <= 64 else max(1, rows // 32) - 1
    title = f"{METRICS[h.metric]} per rank and step (ms); click a cell, or a bar left or below, to select"
    return {
        "animation": False,
        "title": {"text": title, "left": 10, "top": 5, "textStyle": {"fontSize": 14}},
        "tooltip": {"trigger": "item", "confine": True},
        "grid": [
            {"left": cells_left, "right": RIGHT, "top": TOP, "bottom": cells_bottom},
            {"left": LABELS, "width": STRIP_W, "top": TOP, "bottom": cells_bottom},
            {"left": cells_left, "right": RIGHT, "height": STRIP_H, "bottom": BOTTOM},
        ],
        "xAxis": [
            {"type": "category", "gridIndex": 0, "data": steps, "show": False},
            {"type": "value", "gridIndex": 1, "inverse": True, "show": False},
            {
                "type": "category",
                "gridIndex": 2,
                "data": steps,
                "name": "step (click a bar to select a step)",
                "nameLocation": "middle",
                "nameGap": 24,
                "axisTick": {"show": False},
            },
            _band_axis(cols),
        ],
        "yAxis": [
            {"type": "category", "gridIndex": 0, "data": ticks, "inverse": True, "show": False},
            {
                "type": "category",
                "gridIndex": 1,
                "data": [
                    {"value": t, "textStyle": {"color": CULPRIT, "fontWeight": "bold"}}
                    if i in marked
                    else t
                    for i, t in enumerate(ticks)
                ],
                "inverse": True,
                "axisTick": {"show": False},
                "axisLabel": {"interval": every, "fontSize": 11},
            },
            {"type": "value", "gridIndex": 2, "show": False},
            _band_axis(rows, inverse=True),
        ],
        "visualMap": {
            "type": "continuous",
            "seriesIndex": HEATMAP,
            "dimension": 2,
            "min": 0.0,
            "max": zmax,
            "calculable": True,
            "align": "left",
            "right": 8,
            "top": TOP,
            "itemHeight": 200,
            "text": ["ms", ""],
            "precision": 1,
            "inRange": {"color": VIRIDIS},
        },
        "dataset": [json_dataset(cells(h), {"max ms": 2, "mean ms": 2})],
        "series": [
            _cells_series(h),
            _rank_strip(h),
            _step_strip(h),
            _selection(h, selected_rank, selected_step),
        ],
    }


def _zmax(h: Heatmap, skip_steps: int) -> float:
    """The largest cell value from step ``skip_steps`` on (else of all cells; 1 if none)."""
    cols = [j for j, s in enumerate(h.col_steps) if s >= skip_steps]
    for pick in (h.vmax_ms[:, cols], h.vmax_ms):
        if pick.size and np.isfinite(pick).any():
            return round(float(np.nanmax(pick)), 2)
    return 1.0


def binned(h: Heatmap) -> bool:
    """Whether a cell holds more than one rank or step (then the hover gives the mean
    and the rank of the largest value too)."""
    return h.rank_bin > 1 or h.step_bin > 1


def cells(h: Heatmap) -> pd.DataFrame:
    """The cells, one row each, row-major (see :func:`heatmap_figure`), columns
    :data:`CELL_COLUMNS`. Sent as JSON rows (``figures.dataset``): the row's label is
    its y category's (the hover's ``{b}``: "row" is the first category dimension), so no
    string goes with a cell."""
    rows, cols = h.shape
    out = {
        "row": np.repeat(np.arange(rows, dtype=np.int32), cols),
        "col": np.tile(np.arange(cols, dtype=np.int32), rows),
        "max ms": h.vmax_ms.astype(np.float64).ravel(),
    }
    if binned(h):
        out["mean ms"] = h.vmean_ms.astype(np.float64).ravel()
        out["largest in rank"] = h.worst_rank.astype(np.int64).ravel()
    out["step"] = np.tile(np.asarray(h.col_steps, dtype=np.int64), rows)
    return pd.DataFrame(out)


def _cells_series(h: Heatmap) -> dict:
    if h.step_bin == 1:
        steps = "step {@step}"
    else:
        steps = f"steps {{@step}} to {{@step}}+{h.step_bin - 1}"
    text = "{b}<br>" + steps + "<br>"  # {b}: the row's label (its y category)
    if binned(h):
        text += "max {@[2]} ms<br>mean {@[3]} ms, largest in rank {@[4]}"
    else:
        text += "{@[2]} ms"
    return {
        "type": "heatmap",
        "name": "cells",
        "xAxisIndex": 0,
        "yAxisIndex": 0,
        "datasetIndex": 0,
        "encode": {"x": "col", "y": "row"},
        "progressive": 0,
        "selectedMode": "single",
        "select": {"itemStyle": {"borderColor": SELECTED, "borderWidth": 2}},
        "emphasis": {"itemStyle": {"borderColor": "#333", "borderWidth": 1}},
        "tooltip": {"formatter": text},
    }


def _rank_strip(h: Heatmap) -> dict:
    rows = h.shape[0]
    with np.errstate(all="ignore"):
        mean = np.nanmean(h.vmean_ms, axis=1) if h.shape[1] else np.full(rows, np.nan)
    pick = [row_pick(h, i) for i in range(rows)]
    marked = set(h.culprit_rows.values())
    ticks = _tick_labels(h)
    data = []
    for i in range(rows):
        rank = -1 if pick[i] is None else pick[i]
        value = [round(float(np.nan_to_num(mean[i])), 2), i, rank, ticks[i]]
        data.append({"value": value, "itemStyle": {"color": CULPRIT}} if i in marked else value)
    tip = "{@[3]}<br>mean {@[0]} ms per step<br>click: select rank {@[2]}"
    return _strip("rank strip", 1, tip, data)


def _strip(name: str, axis: int, tooltip: str, data: list) -> dict:
    """A clickable bar series beside the heatmap (``axis``: its x/y axis index)."""
    return {
        "type": "bar",
        "name": name,
        "xAxisIndex": axis,
        "yAxisIndex": axis,
        "encode": {"x": 0, "y": 1},
        "barCategoryGap": "10%",
        "itemStyle": {"color": STRIP},
        "selectedMode": "single",
        "select": {"itemStyle": {"borderColor": SELECTED, "borderWidth": 2}},
        "tooltip": {"formatter": tooltip},
        "data": data,
    }


def row_pick(h: Heatmap, row: int) -> int | None:
    """The rank a click on ``row`` of the rank strip selects: the one with the row's
    largest value (its first rank if it has no data; None for an empty row)."""
    values = np.nan_to_num(h.vmax_ms[row], nan=-1.0)
    if values.size and values.max() >= 0 and h.worst_rank[row, values.argmax()] >= 0:
        return int(h.worst_rank[row, values.argmax()])
    return int(h.row_ranks[row][0]) if h.row_ranks[row] else None


def _step_strip(h: Heatmap) -> dict:
    rows, cols = h.shape
    peak = np.nanmax(np.nan_to_num(h.vmax_ms, nan=0.0), axis=0) if rows else np.zeros(cols)
    head = "step {@[2]}" if h.step_bin == 1 else f"steps {{@[2]}} to {{@[2]}}+{h.step_bin - 1}"
    tip = head + ": largest {@[1]} ms<br>click: select this step"
    data = [[j, round(float(peak[j]), 2), int(h.col_steps[j])] for j in range(cols)]
    return _strip("step strip", 2, tip, data)


def _tick_labels(h: Heatmap) -> list[str]:
    """Row labels, culprit rows with "culprit " in front."""
    marked = set(h.culprit_rows.values())
    return [f"culprit {t}" if i in marked else t for i, t in enumerate(h.row_labels)]


def _band_axis(n: int, inverse: bool = False) -> dict:
    """A hidden value axis over the cells' grid on which category position i is i (its
    band [i - 0.5, i + 0.5]): the selection outline's coordinates (a category axis
    snaps a fractional position to the nearest category)."""
    axis = {"type": "value", "gridIndex": 0, "min": -0.5, "max": max(n, 1) - 0.5}
    return {**axis, "inverse": inverse, "show": False}


def _selection(h: Heatmap, rank: int | None, step: int | None) -> dict:
    """Series 3: no points, a markArea outlining the selected rank's row and the
    selected step's column (on the band axes, above the cells)."""
    areas = []
    if rank is not None:
        row = next((i for i, rs in enumerate(h.row_ranks) if rank in rs), None)
        if row is not None:
            areas.append([{"yAxis": row - 0.5}, {"yAxis": row + 0.5}])
    if step is not None and h.step_lo <= step <= h.step_hi:
        col = (step - h.step_lo) // h.step_bin
        areas.append([{"xAxis": col - 0.5}, {"xAxis": col + 0.5}])
    return {
        "type": "line",
        "name": "selection",
        "xAxisIndex": 3,
        "yAxisIndex": 3,
        "data": [],
        "silent": True,
        "markArea": {
            "zlevel": 1,  # a canvas of its own, above the cells' (drawn on a layer above 0)
            "silent": True,
            "itemStyle": {"color": "rgba(0,0,0,0)", "borderColor": SELECTED, "borderWidth": 3},
            "data": areas,
        },
    }
