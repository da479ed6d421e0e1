"""Hosts: per host and GPU, clocks, throttle reasons, power, temperature, ECC/XID
events, NIC and NVLink counters over time, with the run's steps overlaid."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from ranksight.ui import cache
from ranksight.ui.context import PageContext
from ranksight.ui.data.hosts import load_hosts
from ranksight.ui.figures.hosts import hidden_count, hosts_figure


def render(ctx: PageContext) -> None:
    """The Hosts page."""
    run = ctx.selected_run
    st.header(f"Hosts — {run.run_id}")
    hosts = sorted(set(run.ranks["host"].astype(str)))
    st.caption(f"{len(hosts)} host(s): {', '.join(hosts[:20])}{' ...' if len(hosts) > 20 else ''}")
    data = load_hosts(cache.store_for(ctx.url), run)
    if not data.available or data.empty:
        st.info(
            "No collector data for this run (no GPU, NIC or host samples from its hosts during the run; start the node agent with collectors to record them)."
        )
        return
    fig = hosts_figure(data.gpu, data.nic, data.host, data.steps, data.t0)
    st.plotly_chart(fig, width="stretch", key="hosts_chart")
    hidden, lines = hidden_count(fig)
    if hidden:
        st.caption(
            f"{hidden} of {lines} lines are zero throughout and hidden (greyed in the legend; "
            "click one to show it)."
        )
    st.subheader("Throttle reasons and ECC")
    if data.gpu.empty:
        st.caption("No GPU samples (no NVML on these hosts, or no GPU collector running).")
    else:
        st.dataframe(throttle_table(data.gpu), hide_index=True, width="stretch")
    st.subheader("XID and GPU-lost events")
    if data.events.empty:
        st.caption("None during the run.")
    else:
        ev = data.events.assign(at_s=(data.events["ts_ns"] - data.t0) / 1e9)
        st.dataframe(
            ev[["host", "gpu_index", "at_s", "kind", "code", "detail"]],
            hide_index=True,
            width="stretch",
        )


def throttle_table(gpu: pd.DataFrame) -> pd.DataFrame:
    """Per host and GPU: the clock-event (throttle) reasons seen, the lowest and highest
    SM clock, the peak temperature, corrected and uncorrected ECC errors."""
    if gpu.empty:
        return pd.DataFrame()
    rows = []
    for (host, idx), g in gpu.groupby(["host", "gpu_index"]):
        reasons = sorted(
            {r for arr in g["reasons"] for item in arr for r in str(item).split(",") if r}
        )
        rows.append(
            {
                "host": host,
                "gpu": int(idx),
                "throttle reasons": ", ".join(reasons) or "none",
                "SM clock min..max MHz": f"{g['sm_clock'].min():.0f}..{g['sm_clock'].max():.0f}",
                "peak °C": g["temp"].max(),
                "ECC corrected": g["ecc_corr"].max(),
                "ECC uncorrected": g["ecc_uncorr"].max(),
            }
        )
    return pd.DataFrame(rows)
