"""The parts that keep the UI's charts readable, on real stored rows (a synthetic run in
a chdb folder): the timeline's window (bars cut at the step's end, the x axis spanning
the step, every rank row labelled and ROW_PX high), the Hosts page's flat lines hidden.
The browser test (tests/ui/test_ui_browser.py) judges the drawn pages themselves."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from ranksight.store import open_store
from ranksight.ui.data.run import ORDERS, load_run_view
from ranksight.ui.data.timeline import load_timeline
from ranksight.ui.figures import timeline as tf
from ranksight.ui.figures.hosts import hosts_figure

LATE_S = 10
"""How far past its step's end (s) the test's stretched collective ends."""


@pytest.fixture
def stretched(tmp_path):
    """A synthetic 8-rank run with two extra collective rows in step 2 of rank 3: one
    ending LATE_S after the step's end, one that never completed (end 0)."""
    from ranksight.synthetic import SynthConfig, write_synthetic

    url = str(tmp_path / "store")
    with open_store(url) as s:
        s.init_schema()
        write_synthetic(s, SynthConfig(dp=2, tp=2, pp=2, steps=4, run_id="r"))
        steps = s.query(
            "SELECT step, min(start_ns) AS a, max(end_ns) AS b FROM steps GROUP BY step"
        )
        a, b = (int(steps.set_index("step").loc[2, c]) for c in ("a", "b"))
        row = s.query("SELECT * FROM collectives WHERE step = 2 AND rank = 3 LIMIT 1")
        late = row.assign(group_seq=10**6, end_ns=b + LATE_S * 10**9)
        never = row.assign(group_seq=10**6 + 1, end_ns=0)
        s.insert("collectives", pd.concat([late, never], ignore_index=True))
        run = load_run_view(s, "r")
        tl = load_timeline(s, run, (2, 2), ORDERS["pp, tp, dp"], None, 64)
    return tl, (b - a) / 1e6


def test_timeline_bars_are_cut_at_the_steps_end_and_marked(stretched):
    tl, step_ms = stretched
    assert tl.end_ms == pytest.approx(step_ms)
    for rows in (tl.phases, tl.collectives):
        assert rows["t0_ms"].min() >= 0 and rows["t1_ms"].max() <= step_ms + 1e-6
    c = tl.collectives.set_index("group_seq")
    assert c.loc[10**6, "past_ms"] == pytest.approx(
        LATE_S * 1000 + step_ms - c.loc[10**6, "t1_ms"], abs=1
    )
    assert c.loc[10**6, "t1_ms"] == pytest.approx(step_ms)
    assert bool(c.loc[10**6 + 1, "open"]) and c.loc[10**6 + 1, "t1_ms"] == pytest.approx(step_ms)
    fig = tf.timeline_figure(tl)
    past = [t for t in fig.data if t.name == tf.PAST]
    assert len(past) == 1 and len(past[0].base) >= 2 and past[0].marker.pattern.shape == "/"
    lo, hi = fig.layout.xaxis.range
    assert lo <= 0 and hi >= step_ms and step_ms / (hi - lo) >= 0.95


def test_timeline_labels_every_rank_row_and_gives_each_room(stretched):
    tl, _ = stretched
    fig = tf.timeline_figure(tl, marked=(5,))
    labels = list(tl.ranks["label"])
    y = fig.layout.yaxis
    assert list(y.tickvals) == labels == list(y.categoryarray) and len(labels) == 8
    assert [t for t in y.ticktext if "★" in t] == [
        f"<span style='color:{tf.LATE}'><b>★ {tl.ranks.set_index('rank').loc[5, 'label']}</b></span>"
    ]
    plot_px = fig.layout.height - fig.layout.margin.t - fig.layout.margin.b
    assert plot_px / len(labels) >= tf.ROW_PX
    legend = fig.layout.legend
    below_axis = -tf.AXIS_PX / (tf.ROW_PX * len(labels))  # plot heights: under the axis title
    assert (legend.orientation, legend.y, legend.yanchor) == ("h", below_axis, "top")


def test_hosts_hides_lines_that_are_zero_throughout():
    from ranksight.ui.figures.hosts import hidden_count

    ts = np.arange(5) * 10**9
    nic = pd.DataFrame(
        [
            {"host": "h", "device": d, "port": 1, "counter": c, "ts": t, "rate": v}
            for d, c, values in (
                ("mlx5_0", "port_xmit_data", [0, 5e8, 6e8, 5e8, 0]),
                ("mlx5_0", "symbol_error", [0] * 5),
                ("eth0", "rx_dropped", [0, np.nan, 0, 0, 0]),
            )
            for t, v in zip(ts, values, strict=True)
        ]
    )
    empty = pd.DataFrame()
    fig = hosts_figure(empty, nic, empty, empty, 0)
    shown = {t.name: t.visible for t in fig.data}
    assert shown["h mlx5_0:1 port_xmit_data"] is None
    assert shown["h mlx5_0:1 symbol_error"] == shown["h eth0:1 rx_dropped"] == "legendonly"
    assert hidden_count(fig) == (2, 3)
    assert fig.layout.legend.orientation == "v" and fig.layout.legend.x > 1  # right of the plot
