"""Chart numbers sent to the browser as plain JSON rows rather than a dataframe.

``st.echarts_chart`` sends a dataframe ``dataset.source`` as Arrow, and the browser then
loads Streamlit's Arrow reader (about 1 MB of script: ``arrowFormatUtils``, ``moment``,
``numbro``, ...) before it can draw; JSON rows need nothing beyond ECharts itself. At the
sizes the pages send (at most 128 x 100 heatmap cells of 4-6 numbers, 1,000 overview
points) the JSON is under 1 MB and parses in milliseconds (bench/RESULTS.md, "Web UI
load time").
"""

from __future__ import annotations

import numpy as np
import pandas as pd


def json_dataset(frame: pd.DataFrame, decimals: dict[str, int] | None = None) -> dict:
    """The ECharts dataset of ``frame``: ``{"dimensions": [column names], "source": [one
    list per row]}``, integers as ints, floats rounded to ``decimals[column]`` places
    where given, NaN as null (ECharts draws no point or cell there)."""
    decimals = decimals or {}
    columns = []
    for name in frame.columns:
        values = frame[name].to_numpy()
        if values.dtype.kind == "f":
            if name in decimals:
                values = np.round(values, decimals[name])
            missing = np.isnan(values)
            if missing.any():
                out = values.astype(object)
                out[missing] = None
                columns.append(out.tolist())
                continue
        columns.append(values.tolist())
    return {
        "dimensions": [str(c) for c in frame.columns],
        "source": [list(r) for r in zip(*columns, strict=True)],
    }
