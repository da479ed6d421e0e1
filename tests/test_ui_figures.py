"""What the UI's figures send to the browser: numbers as typed arrays sized to the
screen, hover text as templates over them (no string per cell), markers only where few."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import plotly.io as pio

from ranksight.ui.data.heatmap import Heatmap
from ranksight.ui.figures.heatmap import heatmap_figure
from ranksight.ui.figures.overview import MARKERS_UP_TO, overview_figure
from tests.ui_stores import decode


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


def test_binned_heatmap_sends_float32_cells_and_mean_and_rank_per_cell():
    h = grid(256, 400, 4, 3)  # 1,024 ranks x 1,200 steps, binned to the screen
    fig = json.loads(pio.to_json(heatmap_figure(h), validate=False))
    cells = fig["data"][0]
    assert cells["z"]["dtype"] == "f4" and decode(cells["z"]).shape == (256, 400)
    custom = decode(cells["customdata"])
    assert custom.dtype == np.float32 and custom.shape == (256, 400, 2)
    np.testing.assert_allclose(custom[..., 0], h.vmean_ms.astype(np.float32))
    np.testing.assert_array_equal(custom[..., 1], h.worst_rank)
    assert "text" not in cells and "%{customdata[1]" in cells["hovertemplate"]
    sent = len(pio.to_json(heatmap_figure(h), validate=False))
    cells_b64 = 256 * 400 * 12 * 4 / 3  # 12 bytes a cell (z, mean, rank), base64
    assert sent < 1.1 * cells_b64  # axes, strips and layout add under a tenth


def test_unbinned_heatmap_needs_no_customdata():
    fig = json.loads(pio.to_json(heatmap_figure(grid(8, 12, 1, 1)), validate=False))
    assert "customdata" not in fig["data"][0] and "text" not in fig["data"][0]


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

    short = overview_figure(series(MARKERS_UP_TO), {})
    long = overview_figure(series(1000), {})
    assert short.data[0].mode == "lines+markers" and long.data[0].mode == "lines"
    assert long.data[2].mode == "lines"  # tokens/s


def test_step_time_reads_in_ms_below_a_second_and_in_s_above():
    from ranksight.ui.views.overview import duration_text

    assert duration_text(850.2) == "850 ms" and duration_text(1980.4) == "1.98 s"
    assert duration_text(999.4) == "999 ms" and duration_text(999.6) == "1.00 s"
