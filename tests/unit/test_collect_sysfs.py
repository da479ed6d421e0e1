"""RDMA, netdev and topology collectors on sysfs fixture trees (tests/data/sysfs), and the
counter arithmetic they share."""

from __future__ import annotations

import math
import os
import shutil

import pytest

from ranksight.collectors.base import NodeContext, Unavailable
from ranksight.collectors.counters import CounterSet, change
from ranksight.collectors.netdev import NetdevCollector
from ranksight.collectors.rdma import RdmaCollector, RdmaConfig
from ranksight.collectors.topology import TopologyCollector, relation

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", "sysfs")
S = 1_000_000_000


@pytest.fixture
def hgx(tmp_path) -> str:
    """A writable copy of the hgx tree (links kept relative)."""
    root = str(tmp_path / "sys")
    shutil.copytree(os.path.join(FIXTURES, "hgx"), root, symlinks=True)
    return root


def port_dir(root: str, device: str) -> str:
    return os.path.join(root, "class", "infiniband", device, "ports", "1")


def write(path: str, value: object) -> None:
    with open(path, "w") as f:
        f.write(f"{value}\n")


def by_counter(rows: list[dict], device: str) -> dict[str, dict]:
    return {r["counter"]: r for r in rows if r["device"] == device}


def test_counter_changes() -> None:
    assert math.isnan(change(None, 5, S).rate_per_s)
    c = change(10, 25, 2 * S)
    assert (c.delta, c.rate_per_s, c.note) == (15, 7.5, "")
    c = change(2**32 - 100, 50, S)
    assert (c.delta, c.note) == (150, "wrap32")
    c = change(2**64 - 10, 5, S)
    assert (c.delta, c.note) == (15, "wrap64")
    c = change(1_000_000, 20, S)
    assert (c.delta, c.note) == (20, "reset"), "a drop that is no wrap is a reset: count from 0"
    assert math.isnan(change(1, 2, 0).rate_per_s)
    with pytest.raises(ValueError, match="counter value"):
        change(1, -2, S)
    cs = CounterSet()
    cs.update(("a",), 1, 0)
    cs.forget(set())
    assert math.isnan(cs.update(("a",), 9, S).rate_per_s), "a forgotten counter starts over"


def test_rdma_counters_in_bytes_with_rates_wraps_and_resets(hgx) -> None:
    r = RdmaCollector(NodeContext(host="n1", sysfs_root=hgx))
    r.open()
    assert [(p.device, p.port) for p in r.ports] == [("mlx5_0", 1), ("mlx5_1", 1)]
    first = r.collect(10 * S)
    c0 = by_counter(first["nic_samples"], "mlx5_0")
    assert (
        c0["port_xmit_data"]["value"] == 4 * 171798691840
        and c0["port_xmit_data"]["unit"] == "bytes"
    )
    assert c0["np_cnp_sent"]["value"] == 77 and c0["np_cnp_sent"]["unit"] == "count"
    assert math.isnan(c0["port_xmit_data"]["rate_per_s"])
    assert "lifespan" not in c0 and "rx_write_requests" not in c0, (
        "settings and non-default counters skipped"
    )
    assert {
        "out_of_sequence",
        "rp_cnp_handled",
        "port_xmit_wait",
        "symbol_error",
        "link_downed",
    } <= set(c0)
    c1 = by_counter(first["nic_samples"], "mlx5_1")
    assert "np_cnp_sent" not in c1 and "port_rcv_data" in c1, "a device without hw_counters"
    ports = os.path.join(port_dir(hgx, "mlx5_0"))
    write(os.path.join(ports, "counters", "port_xmit_data"), 171798691840 + 2_500_000)  # words
    write(os.path.join(ports, "hw_counters", "rp_cnp_handled"), 100)  # 32-bit counter wrapped
    write(os.path.join(ports, "counters", "symbol_error"), 0)
    second = by_counter(r.collect(12 * S)["nic_samples"], "mlx5_0")
    assert second["port_xmit_data"]["delta"] == 10_000_000
    assert second["port_xmit_data"]["rate_per_s"] == 5_000_000.0, "bytes per second over 2 s"
    assert (second["rp_cnp_handled"]["delta"], second["rp_cnp_handled"]["note"]) == (
        2**32 - 4294967000 + 100,
        "wrap32",
    )
    write(os.path.join(ports, "counters", "symbol_error"), 7)
    r.collect(13 * S)
    write(os.path.join(ports, "counters", "symbol_error"), 2)  # counters cleared, then 2 errors
    third = by_counter(r.collect(14 * S)["nic_samples"], "mlx5_0")
    assert (third["symbol_error"]["delta"], third["symbol_error"]["note"]) == (2, "reset")


def test_rdma_port_rows_at_start_and_on_change(hgx) -> None:
    r = RdmaCollector(NodeContext(host="n1", sysfs_root=hgx))
    r.open()
    start = r.collect(1)["nic_ports"]
    assert [(p["device"], p["state"], p["rate"], p["link_layer"], p["pci"]) for p in start] == [
        ("mlx5_0", "4: ACTIVE", "400 Gb/sec (4X NDR)", "InfiniBand", "0000:04:00.0"),
        ("mlx5_1", "4: ACTIVE", "200 Gb/sec (4X HDR)", "InfiniBand", "0000:81:00.0"),
    ]
    assert r.collect(2)["nic_ports"] == []
    write(os.path.join(port_dir(hgx, "mlx5_1"), "state"), "1: DOWN")
    (down,) = r.collect(3)["nic_ports"]
    assert (down["device"], down["state"]) == ("mlx5_1", "1: DOWN")


def test_rdma_all_counters_and_unavailable(hgx, tmp_path) -> None:
    r = RdmaCollector(NodeContext(sysfs_root=hgx), RdmaConfig(all_counters=True))
    r.open()
    names = set(by_counter(r.collect(1)["nic_samples"], "mlx5_0"))
    assert {"rx_write_requests", "multicast_rcv_packets", "VL15_dropped"} <= names
    assert "lifespan" not in names
    with pytest.raises(Unavailable, match="no RDMA devices under"):
        RdmaCollector(NodeContext(sysfs_root=str(tmp_path / "empty"))).open()
    with pytest.raises(ValueError, match="interval_s"):
        RdmaConfig(interval_s=0)


def test_netdev_counters_skip_plumbing_and_follow_interfaces(hgx) -> None:
    n = NetdevCollector(NodeContext(host="n1", sysfs_root=hgx))
    n.open()
    assert n.interfaces() == ["eth0", "ib0"], "lo, docker0, veth* skipped"
    first = n.collect(1 * S)
    ports = {p["device"]: p for p in first["nic_ports"]}
    assert (ports["eth0"]["pci"], ports["eth0"]["rate"]) == ("0000:00:03.0", ""), (
        "virtio NIC, speed -1"
    )
    assert (ports["ib0"]["link_layer"], ports["ib0"]["rate"], ports["ib0"]["pci"]) == (
        "InfiniBand",
        "400000 Mb/s",
        "0000:04:00.0",
    )
    stats = os.path.join(hgx, "class", "net", "eth0", "statistics")
    write(os.path.join(stats, "rx_bytes"), 98765432100 + 3_000_000)
    second = by_counter(n.collect(3 * S)["nic_samples"], "eth0")
    assert (
        second["rx_bytes"]["delta"],
        second["rx_bytes"]["rate_per_s"],
        second["rx_bytes"]["unit"],
    ) == (3_000_000, 1_500_000.0, "bytes")
    assert second["rx_dropped"]["value"] == 12 and second["rx_dropped"]["unit"] == "count"
    os.unlink(os.path.join(hgx, "class", "net", "ib0"))
    assert {r["device"] for r in n.collect(4 * S)["nic_samples"]} == {"eth0"}


def test_topology_relations_on_an_hgx_node(hgx) -> None:
    t = TopologyCollector(NodeContext(host="n1", sysfs_root=hgx), nvml=_NoNvml())
    t.open()
    pairs = {(p["gpu_pci"], p["nic"]): (p["relation"], p["hops"], p["nearest"]) for p in t.pairs()}
    assert pairs[("0000:03:00.0", "mlx5_0")] == ("PIX", 4, 1), "same PCIe switch"
    assert pairs[("0000:03:00.0", "mlx5_1")] == ("SYS", -1, 0), (
        "other root complex, other NUMA node"
    )
    assert pairs[("0000:05:00.0", "mlx5_0")] == ("PHB", 6, 1), "same root complex, other root port"
    assert pairs[("0000:03:00.0", "ib0")][0] == "PIX"
    assert relation(["pci0000:00", "a"], ["pci0000:80", "b"], 0, 0) == ("NODE", -1)
    two_switches = ["pci0000:00", "rp", "up1", "dn1", "up2", "dn2", "gpu"]
    assert relation(two_switches, ["pci0000:00", "rp", "up1", "dn1b", "nic"], 0, 0) == ("PXB", 6)


class _NoNvml:
    """An NVML module whose init fails as on a node without the driver."""

    def __getattr__(self, name):
        import pynvml

        return getattr(pynvml, name)

    def nvmlInit(self):
        import pynvml

        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
