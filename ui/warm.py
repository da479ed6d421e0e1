"""Read the newest runs' default views into the server's caches while the user's browser
is still loading the app.

A fresh ``ranksight ui`` server pays, on the first run page a user opens: loading the
store's query engine (chdb: about 0.4 s on a 2-core machine), the run's rows, ranks and
findings, and the page's aggregation (the heatmap's cells: 0.3-0.7 s at 1,024 ranks x
1,000 steps; bench/RESULTS.md, "Web UI load time"). The first script run of a server
starts one background thread that makes those same cached reads (``ui.cache``, the same
arguments as the pages' defaults) for the :data:`WARM_RUNS` newest runs: the run view,
the default heatmap (compute time, mesh order, every step; a run's per-rank-step summary
is made then if it is not stored yet) and the overview's step series. A page that
asks for a value the thread is computing waits for it instead of computing it again
(Streamlit's cache holds one lock per value). Errors are logged, never shown: the page
makes the same read and reports its own error.
"""

from __future__ import annotations

import logging
import threading

import streamlit as st
from streamlit.runtime.scriptrunner import add_script_run_ctx, get_script_run_ctx

from ranksight.ui import cache
from ranksight.ui.config import UiConfig
from ranksight.ui.data.run import ORDERS
from ranksight.ui.state import Selection

WARM_RUNS = 3
"""How many of the newest runs a new server reads ahead."""

log = logging.getLogger("ranksight.ui.warm")


def start(url: str, cfg: UiConfig) -> threading.Thread:
    """Start the read-ahead thread for store ``url`` once per server process (later
    calls return the same thread)."""
    return _thread(url, cfg.heatmap_rows, cfg.heatmap_cols, cfg.overview_points)


@st.cache_resource(show_spinner=False)
def _thread(url: str, rows: int, cols: int, points: int) -> threading.Thread:
    thread = threading.Thread(
        target=warm, args=(url, rows, cols, points), name="ranksight-ui-warm", daemon=True
    )
    # The cached reads look for a script context (for their message replay, unused here:
    # they draw nothing); lend the starting script's so they do not warn.
    add_script_run_ctx(thread, get_script_run_ctx())
    thread.start()
    return thread


def warm(url: str, rows: int, cols: int, points: int, runs: int = WARM_RUNS) -> list[str]:
    """Make the default reads of the ``runs`` newest runs in the store at ``url``
    (``rows`` x ``cols`` heatmap cells, ``points`` overview points, as ``UiConfig``).
    Returns the run ids read; a run whose reads fail is logged and skipped."""
    done: list[str] = []
    try:
        listed = cache.run_list(url)
    except Exception as exc:  # noqa: BLE001 - the page reports the store's error itself
        log.info("read-ahead skipped: %s", exc)
        return done
    latest = listed.sort_values("attempt").drop_duplicates("run_id", keep="last")
    latest = latest.sort_values("started_ns", ascending=False).head(runs)
    default = Selection()
    for run_id, attempt in zip(latest["run_id"], latest["attempt"], strict=True):
        try:
            mark = cache.run_mark(url, str(run_id), int(attempt))
            view = cache.run_view(url, str(run_id), int(attempt), mark)
            span = cache.step_range(url, view, mark)
            if span is not None:
                order = ORDERS[default.order]
                cache.heatmap_cells(url, view, mark, default.metric, order, tuple(span), rows, cols)
            cache.step_series(url, view, mark, points)
        except Exception as exc:  # noqa: BLE001
            log.info("read-ahead of run %s skipped: %s", run_id, exc)
            continue
        done.append(str(run_id))
    return done
