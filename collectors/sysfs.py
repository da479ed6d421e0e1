"""Small readers of sysfs files under a configurable root (tests use fixture trees)."""

from __future__ import annotations

import os
import re

BDF = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-9a-f]$")
"""A PCI address as sysfs names it: domain:bus:device.function (``0000:3b:00.0``)."""


def read_text(path: str) -> str | None:
    """The stripped contents of ``path``, or None if it cannot be read (missing file, or
    a driver refusing the read, e.g. EINVAL for a port that is down)."""
    try:
        with open(path, "rb") as f:
            return f.read().decode(errors="replace").strip()
    except OSError:
        return None


def read_int(path: str) -> int | None:
    """``path``'s contents as a non-negative integer (decimal or ``0x`` hex), else None."""
    raw = read_text(path)
    if not raw:
        return None
    try:
        value = int(raw, 16) if raw.startswith("0x") else int(raw)
    except ValueError:
        return None
    return value if value >= 0 else None


def list_dir(path: str) -> list[str]:
    """Sorted entries of ``path`` (empty if it does not exist)."""
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def pci_address(device_link: str) -> str:
    """The PCI address of the device a ``.../device`` link resolves to (``0000:17:00.0``):
    the innermost PCI address in the resolved path, so a virtio NIC (``.../0000:00:03.0/
    virtio2``) gets its PCI function. "" if it is not on PCI (virtual NICs have no
    ``device`` link)."""
    if not os.path.exists(device_link):
        return ""
    for part in reversed(os.path.realpath(device_link).split(os.sep)):
        if BDF.match(part):
            return part
    return ""


def pci_chain(sysfs_root: str, bdf: str) -> list[str]:
    """The device's place in the PCI tree: ``["pci0000:00", "0000:00:01.0", ...,
    bdf]`` from the root complex down, read from the resolved
    ``<root>/bus/pci/devices/<bdf>`` link. Empty if the device is not there."""
    link = os.path.join(sysfs_root, "bus", "pci", "devices", bdf)
    if not os.path.exists(link):
        return []
    parts = os.path.realpath(link).split(os.sep)
    roots = [i for i, p in enumerate(parts) if p.startswith("pci") and ":" in p]
    if not roots:
        return []
    start = roots[-1]
    return [parts[start]] + [p for p in parts[start + 1 :] if BDF.match(p)]


def numa_node(sysfs_root: str, bdf: str) -> int:
    """The device's NUMA node, -1 if unknown."""
    value = read_text(os.path.join(sysfs_root, "bus", "pci", "devices", bdf, "numa_node"))
    try:
        return int(value) if value is not None else -1
    except ValueError:
        return -1
