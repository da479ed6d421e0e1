"""Counters that support a slow-link finding: the NICs and NVLinks of the ranks involved.

A communication-slow group with low arrival skew points at a link (MegaScale, NSDI 2024,
5.2); the counters say whether the hardware saw it: RDMA retransmissions, out-of-sequence
packets, congestion notifications (``np_cnp_sent``, ``rp_cnp_handled``), ``xmit_wait``,
symbol and receive errors, link-downed events and Ethernet drops/errors on the hosts
(``nic_samples``), and NVLink CRC/replay/recovery errors on the GPUs (``gpu_samples``),
summed over the window the finding covers. The numbers become the finding's evidence;
they do not change who is named.
"""

from __future__ import annotations

from collections.abc import Callable

import pandas as pd

NIC_COUNTERS = """
SELECT host, device, counter, sum(delta) AS total
FROM nic_samples
WHERE host IN %(hosts)s AND ts_ns >= %(t0)s AND ts_ns <= %(t1)s
  AND (counter LIKE '%%retrans%%' OR counter LIKE '%%cnp%%' OR counter LIKE '%%out_of_sequence%%'
       OR counter LIKE '%%xmit_wait%%' OR counter LIKE '%%symbol_error%%'
       OR counter LIKE '%%rcv_errors%%' OR counter LIKE '%%link_downed%%'
       OR counter LIKE '%%drop%%' OR counter LIKE '%%err%%')
GROUP BY host, device, counter
HAVING total > 0
ORDER BY total DESC
LIMIT 50
"""
"""Non-zero error and congestion counter increments per host, NIC and counter."""

NVLINK_ERRORS = """
SELECT host, gpu_index,
       max(nvlink_crc_errors) - min(nvlink_crc_errors) AS crc_errors,
       max(nvlink_replay_errors) - min(nvlink_replay_errors) AS replay_errors,
       max(nvlink_recovery_errors) - min(nvlink_recovery_errors) AS recovery_errors,
       min(nvlink_active) AS links_up_min, max(nvlink_active) AS links_up_max
FROM gpu_samples
WHERE host IN %(hosts)s AND ts_ns >= %(t0)s AND ts_ns <= %(t1)s
GROUP BY host, gpu_index
"""
"""NVLink error increments and links up (least, most) per GPU of the hosts."""


def link_counters(
    query: Callable[[str, dict], pd.DataFrame], hosts: list[str], t0_ns: int, t1_ns: int
) -> dict:
    """``{"nic": [...], "nvlink": [...]}``: the counters above for ``hosts`` between
    ``t0_ns`` and ``t1_ns``; NVLink rows only for GPUs with errors or links that went
    down. ``query(sql, params)`` runs SQL on the store (empty frames where a table is
    missing)."""
    if not hosts:
        return {"nic": [], "nvlink": []}
    p = {"hosts": tuple(sorted(set(hosts))), "t0": int(t0_ns), "t1": int(t1_ns)}
    nic = query(NIC_COUNTERS, p)
    nv = query(NVLINK_ERRORS, p)
    if not nv.empty:
        errors = nv[["crc_errors", "replay_errors", "recovery_errors"]].fillna(0).sum(axis=1)
        nv = nv[(errors > 0) | (nv["links_up_min"] < nv["links_up_max"])]
    return {
        "nic": [
            {"host": r.host, "device": r.device, "counter": r.counter, "total": int(r.total)}
            for r in nic.itertuples()
        ],
        "nvlink": [
            {k: (v.item() if hasattr(v, "item") else v) for k, v in r.items()}
            for r in nv.to_dict("records")
        ],
    }
