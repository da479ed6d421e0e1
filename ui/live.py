"""Live refresh: a running run's pages rerun themselves when new steps land."""

from __future__ import annotations

import streamlit as st

from ranksight.ui import cache


def watch(url: str, run, mark, refresh_s: float, probe=None) -> None:
    """Check the run's data version (``data.run.RunMark``) every ``refresh_s`` seconds (in
    a fragment, so only the check reruns) and rerun the whole page when it moved past
    ``mark``, or when ``probe()`` (a page's own cheap check, e.g. the newest progress
    snapshot on the Hang page: a hung run's steps stop but its snapshots go on) returns
    something new."""
    seen = probe() if probe is not None else None

    @st.fragment(run_every=refresh_s)
    def _check() -> None:
        now = cache.run_mark(url, run.run_id, run.attempt)
        if now != mark or (probe is not None and probe() != seen):
            st.rerun(scope="app")
        extra = " or progress snapshots" if probe is not None else ""
        st.caption(
            f"live: this run has not finished; the page refreshes when new steps{extra} land (checked every {refresh_s:g} s)"
        )

    _check()


def watch_runs(url: str, count: int, refresh_s: float) -> None:
    """On the Runs page: rerun when the number of run rows changes (a new run, a status
    change), checked every ``refresh_s`` seconds."""

    @st.fragment(run_every=refresh_s)
    def _check() -> None:
        got = cache.store_for(url).query("SELECT count() AS n FROM runs")
        if int(got["n"].iloc[0]) != count:
            st.rerun(scope="app")

    _check()
