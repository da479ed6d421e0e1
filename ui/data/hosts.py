"""The Hosts page's series: GPU clocks, throttle reasons, power, temperature, ECC, XID
events, NIC and NVLink counters of the run's hosts over the run's time span, binned in
the store to at most ``points`` per series."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from ranksight.store import Store, StoreError

from .run import RUN, RunView
from .stacks import missing_table

SPAN = f"SELECT min(start_ns) AS t0, max(end_ns) AS t1, count() AS n FROM steps WHERE {RUN}"

_WHERE = "host IN %(hosts)s AND ts_ns >= %(t0)s AND ts_ns <= %(t1)s"

GPU = f"""
SELECT host, gpu_index, intDiv(ts_ns - %(t0)s, %(bin)s) AS tbin, min(ts_ns) AS ts,
       avg(sm_clock_mhz) AS sm_clock, max(sm_clock_max_mhz) AS sm_clock_max,
       avg(power_w) AS power, max(power_limit_w) AS power_limit, max(temperature_c) AS temp,
       avg(util_gpu_pct) AS util, max(ecc_corrected) AS ecc_corr, max(ecc_uncorrected) AS ecc_uncorr,
       avg(nvlink_tx_bytes_s) AS nvlink_tx, avg(nvlink_rx_bytes_s) AS nvlink_rx,
       max(nvlink_crc_errors) AS nvlink_crc, groupUniqArray(clock_event_names) AS reasons
FROM gpu_samples WHERE {_WHERE}
GROUP BY host, gpu_index, tbin
ORDER BY host, gpu_index, tbin
"""

EVENTS = f"""
SELECT host, gpu_index, ts_ns, kind, code, detail FROM gpu_events WHERE {_WHERE}
ORDER BY ts_ns LIMIT 500
"""

NIC = f"""
SELECT host, device, port, counter, intDiv(ts_ns - %(t0)s, %(bin)s) AS tbin, min(ts_ns) AS ts,
       avg(rate_per_s) AS rate, any(unit) AS unit_name
FROM nic_samples WHERE {_WHERE} AND counter IN %(counters)s
GROUP BY host, device, port, counter, tbin
ORDER BY host, device, port, counter, tbin
"""

HOST = f"""
SELECT host, intDiv(ts_ns - %(t0)s, %(bin)s) AS tbin, min(ts_ns) AS ts, avg(cpu_pct) AS cpu,
       avg(load1) AS load, max(mem_used_bytes) AS mem_used, max(mem_total_bytes) AS mem_total
FROM host_samples WHERE {_WHERE}
GROUP BY host, tbin
ORDER BY host, tbin
"""

NIC_COUNTERS = (
    "port_xmit_data",
    "port_rcv_data",
    "port_xmit_wait",
    "symbol_error",
    "link_downed",
    "port_rcv_errors",
    "rx_bytes",
    "tx_bytes",
    "rx_errors",
    "tx_errors",
    "rx_dropped",
    "tx_dropped",
)
"""Counters the page plots: RDMA port data, congestion wait and errors; netdev bytes,
errors and drops (sysfs names)."""

STEP_EDGES = f"""
SELECT step, min(start_ns) AS t_start FROM steps WHERE {RUN} GROUP BY step ORDER BY step
"""


@dataclass(frozen=True)
class HostSeries:
    """Collector data for a run's hosts: ``gpu`` (per host, gpu_index, time bin),
    ``events`` (XID / GPU lost), ``nic`` (per host, device, port, counter, time bin),
    ``host`` (CPU %, load, memory per host and time bin), ``steps`` (step -> start ns,
    for the overlay). ``available`` is False when the store
    has no collector tables; times are ns."""

    available: bool
    gpu: pd.DataFrame
    events: pd.DataFrame
    nic: pd.DataFrame
    host: pd.DataFrame
    steps: pd.DataFrame
    t0: int

    @property
    def empty(self) -> bool:
        """True when no collector wrote anything for these hosts in the run's span."""
        return self.gpu.empty and self.events.empty and self.nic.empty and self.host.empty


def load_hosts(store: Store, run: RunView, points: int = 400, pad_s: float = 60.0) -> HostSeries:
    """Collector series of the run's hosts from ``pad_s`` before its first step to
    ``pad_s`` after its last, ``points`` time bins at most. Raises StoreError (other than
    for missing collector tables, which give ``available=False``)."""
    span = store.query(SPAN, run.params)
    hosts = tuple(sorted(set(run.ranks["host"].astype(str)))) if len(run.ranks) else ()
    empty = pd.DataFrame()
    if not hosts or span.empty or int(span["n"].iloc[0]) == 0:
        return HostSeries(True, empty, empty, empty, empty, empty, 0)
    t0 = int(span["t0"].iloc[0] - pad_s * 1e9)
    t1 = int(span["t1"].iloc[0] + pad_s * 1e9)
    p = {
        **run.params,
        "hosts": hosts,
        "t0": t0,
        "t1": t1,
        "bin": max(1, math.ceil((t1 - t0) / points)),
    }
    try:
        gpu, events = store.query(GPU, p), store.query(EVENTS, p)
        nic = store.query(NIC, {**p, "counters": NIC_COUNTERS})
        host = store.query(HOST, p)
    except StoreError as exc:
        if missing_table(exc):
            return HostSeries(False, empty, empty, empty, empty, empty, t0)
        raise
    return HostSeries(True, gpu, events, nic, host, store.query(STEP_EDGES, run.params), t0)
