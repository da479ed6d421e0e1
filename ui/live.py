"""Live refresh: a running run's pages rerun themselves when new steps land."""

from __future__ import annotations

import time

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


def say_stopped(last_record_ns: int, now_ns: int) -> None:
    """The line for a run with no end recorded that went silent: when it stopped
    reporting (UTC) and how long ago; the page does not refresh."""
    at = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(last_record_ns / 1e9))
    st.warning(
        f"Stopped reporting at {at} (no end recorded): nothing from this run for "
        f"{ago((now_ns - last_record_ns) / 1e9)}. It was killed, lost its node or agent, "
        "or is cut off from the store; the page does not refresh."
    )


def ago(seconds: float) -> str:
    """A duration for people: ``"56 s"``, ``"12 min"``, ``"3.2 h"``, ``"4.0 days"``."""
    if seconds < 120:
        return f"{max(seconds, 0):.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h" if seconds < 172800 else f"{seconds / 86400:.1f} days"


def watch_runs(url: str, count: int, refresh_s: float) -> None:
    """On the Runs page: rerun when the number of run rows changes (a new run, a status
    change), checked every ``refresh_s`` seconds."""

    @st.fragment(run_every=refresh_s)
    def _check() -> None:
        got = cache.store_for(url).query("SELECT count() AS n FROM runs")
        if int(got["n"].iloc[0]) != count:
            st.rerun(scope="app")

    _check()
