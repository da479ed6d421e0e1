"""A slow-link finding carries the NIC and NVLink counters of its ranks' hosts."""

from __future__ import annotations

from ranksight.analyzer import analyze
from ranksight.collectors.base import frame
from ranksight.store import open_store
from ranksight.synthetic import SynthConfig, write_synthetic


def test_slow_link_finding_shows_the_retransmissions_on_its_host(store_url):
    store = open_store(store_url)
    store.init_schema()
    cfg = SynthConfig(dp=2, tp=2, pp=2, steps=20, run_id="link",
                      faults=("slow_link:rank=2,delay_ms=40,group=tp,from_step=5",))  # fmt: skip
    write_synthetic(store, cfg)
    ranks = store.query("SELECT rank, any(host) AS host FROM ranks GROUP BY rank ORDER BY rank")
    host = str(ranks.set_index("rank").loc[2, "host"])
    other = str(ranks.set_index("rank").loc[0, "host"])
    t = store.query("SELECT min(start_ns) AS t0, max(end_ns) AS t1 FROM steps")
    t0, t1 = int(t["t0"][0]), int(t["t1"][0])
    mid = (t0 + t1) // 2
    rows = [
        {"host": host, "ts_ns": mid, "kind": "rdma", "device": "mlx5_0", "port": 1,
         "counter": "local_ack_timeout_err", "unit": "count", "value": 90, "delta": 0,
         "rate_per_s": 0.0},
        {"host": host, "ts_ns": mid, "kind": "rdma", "device": "mlx5_0", "port": 1,
         "counter": "np_cnp_sent", "unit": "count", "value": 700, "delta": 700,
         "rate_per_s": 70.0},
        {"host": host, "ts_ns": mid, "kind": "rdma", "device": "mlx5_0", "port": 1,
         "counter": "port_xmit_data", "unit": "bytes", "value": 10**9, "delta": 10**9,
         "rate_per_s": 1e8},  # traffic, not an error: left out
        {"host": other, "ts_ns": t1 + 10**12, "kind": "rdma", "device": "mlx5_0", "port": 1,
         "counter": "roce_slow_restart", "unit": "count", "value": 5, "delta": 5,
         "rate_per_s": 1.0},  # after the run: left out
    ]  # fmt: skip
    store.insert("nic_samples", frame("nic_samples", rows))
    gpu = [{"host": host, "ts_ns": ts, "gpu_index": 0,
            "nvlink_active": 18.0 if i == 0 else 17.0, "nvlink_crc_errors": 10.0 * i}
           for i, ts in enumerate((t0 + 1, mid, t1 - 1))]  # fmt: skip
    store.insert("gpu_samples", frame("gpu_samples", gpu))
    a = analyze(store, "link", save=False)
    (f,) = [f for f in a.findings if f.kind == "slow_communication"]
    links = f.evidence["link_counters"]
    assert links["nic"] == [
        {"host": host, "device": "mlx5_0", "counter": "np_cnp_sent", "total": 700}
    ]
    (nv,) = links["nvlink"]
    assert (nv["crc_errors"], nv["links_up_min"], nv["links_up_max"]) == (20.0, 17.0, 18.0)
