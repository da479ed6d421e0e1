"""RDMA / InfiniBand / RoCE port counters from ``/sys/class/infiniband/*/ports/*``.

``counters/`` holds the IBA PortCounters (``port_xmit_data`` and ``port_rcv_data`` count
4-byte words — "octets divided by 4" in the IBA spec and the kernel's
Documentation/infiniband/sysfs.txt — and are stored here in bytes); ``hw_counters/`` holds
driver counters where the driver has them (mlx5: ``out_of_sequence``, ``packet_seq_err``,
``local_ack_timeout_err``, congestion control ``np_cnp_sent``, ``rp_cnp_handled``...,
32-bit, see ``counters.py``). One ``nic_samples`` row per (port, counter) per sample with
the value, the delta and the rate per second; a ``nic_ports`` row when a port's state,
rate or link layer changes (and at start).
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass

from .base import Collector, NodeContext, Rows, Unavailable
from .counters import MAX_RATE_PER_S, CounterSet
from .sysfs import BAD, list_dir, pci_address, read_int, read_text

WORD_COUNTERS = frozenset({"port_xmit_data", "port_rcv_data"})
"""Counters in 4-byte words; stored multiplied by 4 (bytes)."""

DEFAULT_COUNTERS = frozenset(
    {
        # counters/ (IBA PortCounters)
        "port_xmit_data",
        "port_rcv_data",
        "port_xmit_packets",
        "port_rcv_packets",
        "port_xmit_wait",
        "port_xmit_discards",
        "port_rcv_errors",
        "port_rcv_remote_physical_errors",
        "symbol_error",
        "link_downed",
        "link_error_recovery",
        "local_link_integrity_errors",
        "excessive_buffer_overrun_errors",
        # hw_counters/ (mlx5 and others): retransmission, ordering, congestion control
        "out_of_sequence",
        "out_of_buffer",
        "packet_seq_err",
        "local_ack_timeout_err",
        "rnr_nak_retry_err",
        "implied_nak_seq_err",
        "duplicate_request",
        "req_cqe_error",
        "resp_cqe_error",
        "np_cnp_sent",
        "np_ecn_marked_roce_packets",
        "rp_cnp_handled",
        "rp_cnp_ignored",
        "roce_adp_retrans",
        "roce_adp_retrans_to",
        "roce_slow_restart",
        "rx_icrc_encapsulated",
    }
)
"""Counters read by default: traffic, link errors, retransmission and congestion."""

NOT_COUNTERS = frozenset({"lifespan"})
"""Files in ``hw_counters/`` that are settings, not counters."""
_U64 = 1 << 64


@dataclass(kw_only=True, slots=True)
class RdmaConfig:
    """What the RDMA collector reads."""

    interval_s: float = 1.0
    """Seconds between samples."""
    all_counters: bool = False
    """Read every counter file, not only :data:`DEFAULT_COUNTERS`."""

    def __post_init__(self) -> None:
        if self.interval_s <= 0:
            raise ValueError(f"rdma interval_s must be > 0, got {self.interval_s}")


@dataclass(frozen=True, slots=True)
class Port:
    """One RDMA port: its sysfs folder, device name and port number."""

    path: str
    device: str
    port: int


class RdmaCollector(Collector):
    """Reads every port under ``<sysfs_root>/class/infiniband``."""

    name = "rdma"
    tables = ("nic_samples", "nic_ports")

    def __init__(self, ctx: NodeContext, config: RdmaConfig | None = None) -> None:
        self.ctx = ctx
        self.config = config or RdmaConfig()
        self.interval_s = self.config.interval_s
        self.ports: list[Port] = []
        self._counters = CounterSet()
        self._states: dict[tuple[str, int], tuple] = {}

    def open(self) -> None:
        """Find the ports (folders named by a port number, 1-255 as IB numbers them);
        raises :class:`Unavailable` if there are none."""
        root = os.path.join(self.ctx.sysfs_root, "class", "infiniband")
        self.ports = []
        for path in sorted(glob.glob(os.path.join(glob.escape(root), "*", "ports", "*"))):
            name = os.path.basename(path)
            if name.isascii() and name.isdigit() and 0 < int(name) < 256:
                device = os.path.basename(os.path.dirname(os.path.dirname(path)))
                self.ports.append(Port(path, device, int(name)))
        if not self.ports:
            raise Unavailable(f"no RDMA devices under {root}")

    def collect(self, now_ns: int) -> Rows:
        """Counter rows of every port, and port rows for changed ports."""
        samples, ports = [], []
        for port in self.ports:
            ports.extend(self._port_row(port, now_ns))
            for counter, raw in self._read(port):
                samples.append(self._sample(port, counter, raw, now_ns))
        return {"nic_samples": samples, "nic_ports": ports}

    def _read(self, port: Port) -> list[tuple[str, int]]:
        """(counter, raw value) of the port's counter files that could be read."""
        out = []
        for sub in ("counters", "hw_counters"):
            folder = os.path.join(port.path, sub)
            for name in list_dir(folder):
                if name in NOT_COUNTERS or not (
                    self.config.all_counters or name in DEFAULT_COUNTERS
                ):
                    continue
                path = os.path.join(folder, name)
                value = read_int(path)
                if value is not None and name in WORD_COUNTERS and value >= _U64 // 4:
                    BAD.note(path, f"{value} words are more bytes than 64 bits hold: not read")
                elif value is not None:
                    out.append((name, value))
        return out

    def _sample(self, port: Port, counter: str, raw: int, now_ns: int) -> dict:
        """One ``nic_samples`` row (wrap/reset detected on the raw value)."""
        scale = 4 if counter in WORD_COUNTERS else 1
        unit = "bytes" if scale == 4 else "count"
        key = (port.device, port.port, counter)
        ch = self._counters.update(key, raw, now_ns, MAX_RATE_PER_S[unit] / scale)
        return {
            "host": self.ctx.host,
            "ts_ns": now_ns,
            "kind": "rdma",
            "device": port.device,
            "port": port.port,
            "counter": counter,
            "unit": unit,
            "value": raw * scale,
            "delta": ch.delta * scale,
            "rate_per_s": ch.rate_per_s * scale,
            "note": ch.note,
        }

    def _port_row(self, port: Port, now_ns: int) -> list[dict]:
        """A ``nic_ports`` row if the port's state/rate/link layer changed since last time."""
        state = tuple(
            read_text(os.path.join(port.path, f)) or ""
            for f in ("state", "phys_state", "rate", "link_layer")
        )
        key = (port.device, port.port)
        if self._states.get(key) == state:
            return []
        self._states[key] = state
        device_dir = os.path.dirname(os.path.dirname(port.path))
        return [
            {
                "host": self.ctx.host,
                "ts_ns": now_ns,
                "kind": "rdma",
                "device": port.device,
                "port": port.port,
                "state": state[0],
                "phys_state": state[1],
                "rate": state[2],
                "link_layer": state[3],
                "pci": pci_address(os.path.join(device_dir, "device")),
            }
        ]
