"""The run overview's figure as an ECharts option (``st.echarts_chart``): step time and
throughput over steps, culprit onsets marked. ECharts rather than Plotly for the page's
first render (see ``figures.heatmap``)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ranksight.ui.figures.dataset import json_dataset

MARKERS_UP_TO = 120
"""Points per series drawn with markers; longer series are lines only."""

ONSET = "#d62728"
HEIGHT = 480
"""The chart's height (px)."""


SLOWEST = "slowest rank's own step (ms)"
"""The slowest rank's own step time: its start to its end. Never above the step time
(the first rank's start to the last rank's end); below it by how far the ranks' starts
and ends are staggered."""


def overview_figure(series: pd.DataFrame, marks: list[tuple[int, str]]) -> dict:
    """Top: the job's step time (first rank's start to last rank's end) and the slowest
    rank's own step time (ms, :data:`SLOWEST`); bottom: tokens/s and, on a second axis,
    MFU (%) where known, else the achieved model TFLOP/s where the FLOPs per token are
    known. ``marks`` are (step, label) of the findings' onsets, drawn as dashed lines
    (labelled on the top panel; the x axis reaches the last of them: a hang's step has
    no step rows). The numbers are ``dataset[0]`` (one row per step bin,
    columns ``step`` (first step of the bin), ``step time (ms)``, SLOWEST,
    ``tokens/s`` and ``MFU %`` or ``model TFLOP/s``); series 0 is the step time."""
    has_mfu = bool(series["mfu"].notna().any())
    has_tflops = not has_mfu and "tflops" in series and bool(series["tflops"].notna().any())
    data = pd.DataFrame(
        {
            "step": series["first_step"].to_numpy(np.int64),
            "step time (ms)": series["step_ms"].to_numpy(np.float64),
            SLOWEST: series["slowest_rank_ms"].to_numpy(np.float64),
            "tokens/s": series["tokens_per_s"].to_numpy(np.float64),
        }
    )
    second = None
    if has_mfu:
        second, data["MFU %"] = "MFU %", series["mfu"].to_numpy(np.float64) * 100
    elif has_tflops:
        second, data["model TFLOP/s"] = "model TFLOP/s", series["tflops"].to_numpy(np.float64)
    symbols = len(series) <= MARKERS_UP_TO
    onsets = _onsets(marks)

    def line(name: str, grid: int, axis: int, fmt: str, **extra) -> dict:
        return {
            "type": "line",
            "name": name,
            "datasetIndex": 0,
            "encode": {"x": "step", "y": name},
            "xAxisIndex": grid,
            "yAxisIndex": axis,
            "showSymbol": symbols,
            "tooltip": {"valueFormatter": fmt},
            **extra,
        }

    out = [
        line("step time (ms)", 0, 0, "%.1f ms", markLine=onsets(True)),
        line(SLOWEST, 0, 0, "%.1f ms", showSymbol=False, lineStyle={"type": "dotted"}),
        line("tokens/s", 1, 1, "%.0f", markLine=onsets(False)),
    ]
    if second is not None:
        out.append(line(second, 1, 2, "%.2f", showSymbol=False))
    lower = "throughput (tokens/s)" + (f" and {second}" if second else "")
    last = max([int(data["step"].max()), *(int(step) for step, _ in marks)])
    x = {"type": "value", "min": "dataMin", "max": last, "minInterval": 1}  # marks drawn too
    return {
        "animation": False,
        "title": [
            {"text": "step time (ms)", "left": 10, "top": 0, "textStyle": {"fontSize": 14}},
            {"text": lower, "left": 10, "top": "49%", "textStyle": {"fontSize": 14}},
        ],
        "legend": {"bottom": 0},
        "tooltip": {"trigger": "axis"},
        "axisPointer": {"link": [{"xAxisIndex": "all"}]},
        "grid": [
            {"left": 70, "right": 70, "top": 35, "height": "30%"},
            {"left": 70, "right": 70, "top": "57%", "height": "30%"},
        ],
        "xAxis": [
            {**x, "gridIndex": 0},
            {**x, "gridIndex": 1, "name": "step", "nameLocation": "middle", "nameGap": 24},
        ],
        "yAxis": [
            {"type": "value", "gridIndex": 0, "scale": True},
            {"type": "value", "gridIndex": 1, "scale": True},
            {
                "type": "value",
                "gridIndex": 1,
                "position": "right",
                "scale": True,
                "splitLine": {"show": False},
                "show": second is not None,
            },
        ],
        "dataset": [json_dataset(data)],
        "series": out,
    }


def _onsets(marks: list[tuple[int, str]]):
    """markLine options at each (step, label) of ``marks`` (labelled on the top panel)."""

    def option(labelled: bool) -> dict:
        return {
            "silent": True,
            "symbol": "none",
            "lineStyle": {"color": ONSET, "type": "dashed"},
            "label": {"show": labelled, "formatter": "{b}", "color": ONSET},
            "data": [{"xAxis": int(step), "name": label} for step, label in sorted(marks)],
        }

    return option
