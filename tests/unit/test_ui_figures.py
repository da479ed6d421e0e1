"""What the UI's ECharts figures send to the browser: numbers as JSON rows of a dataset
(no Arrow reader to load), hover text as templates over its columns (no string per cell),
markers only where few, and what a click on each series selects."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from ranksight.ui.data.heatmap import Heatmap
from ranksight.ui.figures.heatmap import (
    HEATMAP,
    RANK_STRIP,
    SELECTION,
    STEP_STRIP,
    cells,
    heatmap_figure,
)
from ranksight.ui.figures.overview import MARKERS_UP_TO, overview_figure
from tests.helpers.ui_stores import with_frames


def grid(rows: int, cols: int, rank_bin: int, step_bin: int) -> Heatmap:
    rng = np.random.default_rng(0)
    vmax = rng.uniform(10, 20, (rows, cols))
    return Heatmap(
        metric="compute",
        vmax_ms=vmax,
        vmean_ms=vmax * 0.9,
        worst_rank=rng.integers(0, rows * rank_bin, (rows, cols)),
        worst_step=rng.integers(0, cols * step_bin, (rows, cols)),
        row_labels=[f"{rank_bin} ranks row {i}" for i in range(rows)],
        row_ranks=[list(range(i * rank_bin, (i + 1) * rank_bin)) for i in range(rows)],
        col_steps=[j * step_bin for j in range(cols)],
        rank_bin=rank_bin,
        step_bin=step_bin,
        step_lo=0,
        step_hi=cols * step_bin - 1,
        culprit_rows={5: 1},
    )


def sent(spec: dict) -> tuple[pd.DataFrame, int]:
    """The cells' dataset and the size of the rest of the option as JSON (bytes)."""
    rest = {**spec, "dataset": [{"source": None}]}
    return with_frames(json.loads(json.dumps(spec)))["dataset"][0]["source"], len(json.dumps(rest))


def test_binned_heatmap_sends_each_cell_with_its_mean_and_rank_as_numbers():
    h = grid(128, 100, 8, 10)  # 1,024 ranks x 1,000 steps, binned to the screen
    spec = heatmap_figure(h)
    source, rest = sent(spec)
    assert len(source) == 128 * 100 and spec["series"][HEATMAP]["datasetIndex"] == 0
    z = source.pivot(index="row", columns="col", values="max ms").to_numpy()
    np.testing.assert_allclose(z, h.vmax_ms, atol=0.005 + 1e-9)
    mean = source.pivot(index="row", columns="col", values="mean ms").to_numpy()
    np.testing.assert_allclose(mean, h.vmean_ms, atol=0.005 + 1e-9)
    worst = source.pivot(index="row", columns="col", values="largest in rank").to_numpy()
    np.testing.assert_array_equal(worst, h.worst_rank)
    assert all(isinstance(v, int | float) for v in spec["dataset"][0]["source"][0])  # no strings
    tip = spec["series"][HEATMAP]["tooltip"]["formatter"]
    assert "{@[3]} ms, largest in rank {@[4]}" in tip and tip.startswith("{b}<br>")
    assert spec["dataset"][0]["dimensions"][0] == "row"  # {b}: the row's y category
    assert list(source.columns[2:5]) == ["max ms", "mean ms", "largest in rank"]
    assert spec["visualMap"]["dimension"] == 2  # colored by the largest value
    assert rest < 60_000  # strips, axes and labels (128 rows, 100 columns) stay small


def test_unbinned_heatmap_sends_no_mean_or_rank():
    source, _ = sent(heatmap_figure(grid(8, 12, 1, 1)))
    assert list(source.columns) == ["row", "col", "max ms", "step"]


def test_heatmap_marks_culprits_and_the_selection_and_clicks_pick_rank_and_step():
    from ranksight.ui.views.heatmap import click_target

    h = grid(16, 10, 4, 3)  # culprit rank 5 in row 1
    spec = heatmap_figure(h, selected_rank=9, selected_step=7)
    labels = spec["yAxis"][1]["data"]
    assert labels[1] == {
        "value": "culprit 4 ranks row 1",
        "textStyle": {"color": "#d62728", "fontWeight": "bold"},
    }
    assert all(isinstance(t, str) and not t.startswith("culprit") for t in labels[2:])
    assert spec["series"][RANK_STRIP]["data"][1]["itemStyle"]["color"] == "#d62728"
    outline = spec["series"][SELECTION]  # on value axes where category i is i
    areas = outline["markArea"]["data"]
    assert areas == [[{"yAxis": 1.5}, {"yAxis": 2.5}], [{"xAxis": 1.5}, {"xAxis": 2.5}]]
    x, y = spec["xAxis"][outline["xAxisIndex"]], spec["yAxis"][outline["yAxisIndex"]]
    assert (x["type"], x["min"], x["max"], x["gridIndex"]) == ("value", -0.5, 9.5, 0)
    assert (y["type"], y["min"], y["max"], y["inverse"]) == ("value", -0.5, 15.5, True)
    assert all(s["selectedMode"] == "single" for s in spec["series"][:SELECTION])
    row, col = 3, 4
    assert click_target(h, HEATMAP, row * 10 + col) == (
        int(h.worst_rank[row, col]),
        int(h.worst_step[row, col]),
    )
    strip = spec["series"][RANK_STRIP]["data"][row]
    assert click_target(h, RANK_STRIP, row) == (strip[2], None)
    assert strip[2] == h.worst_rank[row, np.nanargmax(h.vmax_ms[row])]
    assert click_target(h, STEP_STRIP, col) == (None, h.col_steps[col])
    assert spec["series"][STEP_STRIP]["data"][col][2] == h.col_steps[col]
    assert click_target(h, HEATMAP, 16 * 10) is None and click_target(h, 7, 0) is None


def test_cells_are_row_major():
    h = grid(3, 4, 1, 1)
    source = cells(h)
    assert list(source["row"][:5]) == [0, 0, 0, 0, 1] and list(source["col"][:5]) == [0, 1, 2, 3, 0]


def test_overview_draws_markers_only_on_short_series():
    def series(n: int) -> pd.DataFrame:
        return pd.DataFrame(
            {
                "first_step": np.arange(n),
                "n_steps": 1,
                "step_ms": 100.0,
                "slowest_rank_ms": 120.0,
                "tokens_per_s": 1e4,
                "mfu": np.nan,
            }
        )

    short = overview_figure(series(MARKERS_UP_TO), [(40, "rank 3 slow from here")])
    long = overview_figure(series(1000), [])
    assert short["series"][0]["showSymbol"] and not long["series"][0]["showSymbol"]
    assert not long["series"][2]["showSymbol"]  # tokens/s
    assert pd.DataFrame(long["dataset"][0]["source"]).shape == (1000, 4)  # no MFU or FLOPs
    onset = short["series"][0]["markLine"]["data"]
    assert onset == [{"xAxis": 40, "name": "rank 3 slow from here"}]


def test_step_time_reads_in_ms_below_a_second_and_in_s_above():
    from ranksight.ui.views.overview import duration_text

    assert duration_text(850.2) == "850 ms" and duration_text(1980.4) == "1.98 s"
    assert duration_text(999.4) == "999 ms" and duration_text(999.6) == "1.00 s"


def test_empty_cells_are_sent_as_null_and_values_rounded():
    h = grid(2, 3, 1, 1)
    vmax = h.vmax_ms.copy()
    vmax[1, 2] = np.nan  # a rank with no data in that step
    h = Heatmap(**{**h.__dict__, "vmax_ms": vmax})
    source = heatmap_figure(h)["dataset"][0]["source"]
    assert source[5][2] is None and json.loads(json.dumps(source))[5][2] is None
    assert source[0][2] == round(float(vmax[0, 0]), 2) and source[0][:2] == [0, 0]
