"""Which NIC serves which GPU, from the PCI tree in sysfs.

Every NVIDIA GPU (PCI vendor 0x10de, display/3D class) is paired with every RDMA device
and every netdev that is a PCI device. Each pair gets nvidia-smi ``topo -m``'s words,
computed from the two devices' places in the PCI tree (``sysfs.pci_chain``):

- ``PIX``: they share a PCIe switch, at most 4 links apart (one switch between them);
- ``PXB``: they share a bridge below the root port, further apart (several switches);
- ``PHB``: same root complex (host bridge), different root ports;
- ``NODE``: different root complexes on the same NUMA node;
- ``SYS``: different NUMA nodes (the path crosses the CPU interconnect).

``nearest`` marks, per GPU and NIC kind, the closest NIC (by that order, then links).
Rows are written at start and whenever the pairing changes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from .base import Collector, NodeContext, Rows, Unavailable
from .nvml import load_nvml, pci_bus_id, text
from .nvml_read import gpu_count
from .sysfs import list_dir, numa_node, pci_address, pci_chain, read_text

RELATIONS = ("PIX", "PXB", "PHB", "NODE", "SYS")
"""Closest first."""


@dataclass(frozen=True, slots=True)
class Nic:
    """A PCI network device: name, kind (rdma | netdev), PCI address."""

    name: str
    kind: str
    pci: str


def relation(a: list[str], b: list[str], numa_a: int, numa_b: int) -> tuple[str, int]:
    """``(relation, hops)`` between two devices given by :func:`sysfs.pci_chain` and their
    NUMA nodes; hops is -1 when they are under different root complexes."""
    if not a or not b or a[0] != b[0]:
        same = numa_a >= 0 and numa_a == numa_b
        return ("NODE" if same else "SYS"), -1
    common = 0
    for x, y in zip(a[1:], b[1:], strict=False):
        if x != y:
            break
        common += 1
    hops = (len(a) - 1 - common) + (len(b) - 1 - common)
    if common == 0:
        return "PHB", hops
    return ("PIX" if hops <= 4 else "PXB"), hops


def nvidia_gpus(sysfs_root: str) -> list[str]:
    """PCI addresses of NVIDIA display/3D controllers under ``<root>/bus/pci/devices``."""
    base = os.path.join(sysfs_root, "bus", "pci", "devices")
    found = []
    for bdf in list_dir(base):
        vendor = read_text(os.path.join(base, bdf, "vendor"))
        klass = read_text(os.path.join(base, bdf, "class")) or ""
        if vendor == "0x10de" and klass.startswith("0x03"):
            found.append(bdf)
    return found


def nics(sysfs_root: str) -> list[Nic]:
    """RDMA devices and PCI netdevs (virtual interfaces have no PCI address)."""
    out = []
    for kind, sub in (("rdma", ("class", "infiniband")), ("netdev", ("class", "net"))):
        base = os.path.join(sysfs_root, *sub)
        for name in list_dir(base):
            pci = pci_address(os.path.join(base, name, "device"))
            if pci:
                out.append(Nic(name, kind, pci))
    return out


class TopologyCollector(Collector):
    """Writes ``gpu_nic`` rows; GPU index and UUID come from NVML where it is available."""

    name = "topology"
    tables = ("gpu_nic",)

    def __init__(self, ctx: NodeContext, *, interval_s: float = 300.0, nvml: Any = None) -> None:
        if interval_s <= 0:
            raise ValueError(f"topology interval_s must be > 0, got {interval_s}")
        self.ctx = ctx
        self.interval_s = interval_s
        self._nvml_arg = nvml
        self._ids: dict[str, tuple[int, str]] = {}
        self._last: list[tuple] | None = None

    def open(self) -> None:
        """Map GPU PCI addresses to NVML index/UUID if NVML is there. Raises
        :class:`Unavailable` if sysfs shows no NVIDIA GPU or no PCI NIC."""
        if not nvidia_gpus(self.ctx.sysfs_root):
            raise Unavailable(f"no NVIDIA GPU in {self.ctx.sysfs_root}/bus/pci/devices")
        if not nics(self.ctx.sysfs_root):
            raise Unavailable(f"no PCI network device under {self.ctx.sysfs_root}/class")
        try:
            n = load_nvml(self._nvml_arg)
        except Unavailable:
            return
        try:
            for index in range(gpu_count(n)):
                h = n.nvmlDeviceGetHandleByIndex(index)
                bus = pci_bus_id(getattr(n.nvmlDeviceGetPciInfo(h), "busId", ""))
                self._ids[bus] = (index, text(n.nvmlDeviceGetUUID(h)))
        except (n.NVMLError, Unavailable):  # the PCI tree alone still pairs them
            pass
        finally:
            n.nvmlShutdown()

    def pairs(self) -> list[dict]:
        """One dict per (GPU, NIC) with the ``gpu_nic`` columns but host and time."""
        root, out = self.ctx.sysfs_root, []
        for gpu in nvidia_gpus(root):
            chain, numa = pci_chain(root, gpu), numa_node(root, gpu)
            index, uuid = self._ids.get(gpu, (-1, ""))
            rows = []
            for nic in nics(root):
                rel, hops = relation(
                    chain, pci_chain(root, nic.pci), numa, numa_node(root, nic.pci)
                )
                rows.append(
                    {
                        "gpu_index": index,
                        "gpu_uuid": uuid,
                        "gpu_pci": gpu,
                        "nic": nic.name,
                        "nic_kind": nic.kind,
                        "nic_pci": nic.pci,
                        "relation": rel,
                        "hops": hops,
                        "nearest": 0,
                    }
                )
            _mark_nearest(rows)
            out.extend(rows)
        return out

    def collect(self, now_ns: int) -> Rows:
        """All pairs if anything changed since the last call, else nothing."""
        pairs = self.pairs()
        key = [tuple(sorted(p.items())) for p in pairs]
        if key == self._last:
            return {}
        self._last = key
        return {"gpu_nic": [{"host": self.ctx.host, "ts_ns": now_ns, **p} for p in pairs]}


def _mark_nearest(rows: list[dict]) -> None:
    """Set ``nearest`` on the closest NIC of each kind (rows of one GPU)."""
    for kind in {r["nic_kind"] for r in rows}:
        mine = [r for r in rows if r["nic_kind"] == kind]
        best = min(
            mine,
            key=lambda r: (RELATIONS.index(r["relation"]), r["hops"] if r["hops"] >= 0 else 99),
        )
        best["nearest"] = 1
