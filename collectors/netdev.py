"""Ethernet (and IPoIB) interface counters from ``/sys/class/net/*/statistics``.

The kernel's ``struct rtnl_link_stats64`` fields (Documentation/ABI/testing/sysfs-class-net-
statistics): bytes, packets, errors and drops per direction, 64-bit. One ``nic_samples``
row (kind ``netdev``, port 0) per (interface, counter) per sample; a ``nic_ports`` row
when an interface's operstate or speed changes (and at start). Loopback and container /
bridge interfaces are skipped by default.
"""

from __future__ import annotations

import fnmatch
import os
from dataclasses import dataclass

from .base import Collector, NodeContext, Rows, Unavailable
from .counters import MAX_RATE_PER_S, CounterSet
from .sysfs import list_dir, parse_uint, pci_address, read_int, read_text

DEFAULT_COUNTERS = (
    "rx_bytes",
    "tx_bytes",
    "rx_packets",
    "tx_packets",
    "rx_errors",
    "tx_errors",
    "rx_dropped",
    "tx_dropped",
    "rx_crc_errors",
    "rx_missed_errors",
    "rx_fifo_errors",
    "tx_carrier_errors",
    "collisions",
)
"""Counters read by default."""

DEFAULT_EXCLUDE = (
    "lo",
    "veth*",
    "docker*",
    "br-*",
    "virbr*",
    "cali*",
    "flannel*",
    "cni*",
    "tunl*",
    "vxlan*",
)
"""Interfaces skipped by default (shell patterns): loopback, container and bridge plumbing."""

_LINK_LAYER = {"1": "Ethernet", "32": "InfiniBand", "772": "Loopback"}
"""``/sys/class/net/*/type`` (ARPHRD_* in if_arp.h) names."""


@dataclass(kw_only=True, slots=True)
class NetdevConfig:
    """What the netdev collector reads."""

    interval_s: float = 1.0
    """Seconds between samples."""
    counters: tuple[str, ...] = DEFAULT_COUNTERS
    """Files of ``statistics/`` to read."""
    exclude: tuple[str, ...] = DEFAULT_EXCLUDE
    """Interface name patterns to skip."""

    def __post_init__(self) -> None:
        if self.interval_s <= 0:
            raise ValueError(f"netdev interval_s must be > 0, got {self.interval_s}")
        if not self.counters:
            raise ValueError("netdev counters must not be empty")


class NetdevCollector(Collector):
    """Reads ``<sysfs_root>/class/net/<if>/statistics`` of every interface not excluded
    (the list is re-read each sample: interfaces come and go)."""

    name = "netdev"
    tables = ("nic_samples", "nic_ports")

    def __init__(self, ctx: NodeContext, config: NetdevConfig | None = None) -> None:
        self.ctx = ctx
        self.config = config or NetdevConfig()
        self.interval_s = self.config.interval_s
        self.root = os.path.join(ctx.sysfs_root, "class", "net")
        self._counters = CounterSet()
        self._states: dict[str, tuple] = {}

    def interfaces(self) -> list[str]:
        """Interfaces present now and not excluded."""
        return [
            name
            for name in list_dir(self.root)
            if not any(fnmatch.fnmatchcase(name, p) for p in self.config.exclude)
            and os.path.isdir(os.path.join(self.root, name, "statistics"))
        ]

    def open(self) -> None:
        """Raises :class:`Unavailable` if no interface with statistics is found."""
        if not self.interfaces():
            raise Unavailable(f"no network interfaces with statistics under {self.root}")

    def collect(self, now_ns: int) -> Rows:
        """Counter rows of every interface, port rows for changed ones."""
        samples, ports, keep = [], [], set()
        for name in self.interfaces():
            ports.extend(self._port_row(name, now_ns))
            stats = os.path.join(self.root, name, "statistics")
            for counter in self.config.counters:
                value = read_int(os.path.join(stats, counter))
                if value is None:
                    continue
                keep.add((name, counter))
                unit = "bytes" if counter.endswith("_bytes") else "count"
                ch = self._counters.update((name, counter), value, now_ns, MAX_RATE_PER_S[unit])
                samples.append(
                    {
                        "host": self.ctx.host,
                        "ts_ns": now_ns,
                        "kind": "netdev",
                        "device": name,
                        "port": 0,
                        "counter": counter,
                        "unit": unit,
                        "value": value,
                        "delta": ch.delta,
                        "rate_per_s": ch.rate_per_s,
                        "note": ch.note,
                    }
                )
        self._counters.forget(keep)
        return {"nic_samples": samples, "nic_ports": ports}

    def _port_row(self, name: str, now_ns: int) -> list[dict]:
        """A ``nic_ports`` row if the interface's operstate or speed changed."""
        base = os.path.join(self.root, name)
        state = tuple(
            read_text(os.path.join(base, f)) or ""
            for f in ("operstate", "carrier", "speed", "type")
        )
        if self._states.get(name) == state:
            return []
        self._states[name] = state
        row = {"host": self.ctx.host, "ts_ns": now_ns, "kind": "netdev", "device": name, "port": 0}
        return [
            {
                **row,
                "state": state[0],
                "phys_state": f"carrier={state[1]}" if state[1] else "",
                "rate": f"{state[2]} Mb/s" if parse_uint(state[2]) else "",  # -1: no link
                "link_layer": _LINK_LAYER.get(state[3], state[3]),
                "pci": pci_address(os.path.join(base, "device")),
            }
        ]
