"""Small readers of sysfs and procfs files under a configurable root (tests use fixture
trees). Every read is bounded and never waits: a file that is not a regular file (a
folder, a FIFO, a device) or longer than any attribute is not read, and a counter that is
not a plain unsigned 64-bit number is not a value; either is counted and logged once per
file (:data:`BAD`)."""

from __future__ import annotations

import logging
import os
import re
import stat

from .complaints import Complaints

BDF = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-9a-f]$")
"""A PCI address as sysfs names it: domain:bus:device.function (``0000:3b:00.0``)."""
MAX_BYTES = 1 << 16
"""Most bytes a file read here may hold: a sysfs attribute holds at most a page (4 KiB),
a ``/proc/<pid>/task/<tid>/schedstat`` line under 100 bytes."""
UINT = re.compile(r"0x[0-9a-fA-F]{1,16}|[0-9]{1,20}", re.ASCII)
"""A counter as the kernel prints it: decimal or ``0x`` hex digits, nothing else."""
_U64 = 1 << 64

BAD = Complaints(logging.getLogger("ranksight.collectors.sysfs"))
"""Files whose content was no value, counted by path."""


class NotAFile(OSError):
    """The path is not a regular file (a folder, a FIFO, a device): not read."""


def read_head(path: str, limit: int) -> bytes:
    """The first ``limit + 1`` bytes of the regular file at ``path`` (all of it when
    shorter; more than ``limit`` means it is longer), opened without waiting so that a
    FIFO never blocks. Raises :class:`NotAFile` if ``path`` is no regular file, OSError
    if it cannot be opened or read."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotAFile(f"{path} is not a regular file")
        data = b""
        while len(data) <= limit and (block := os.read(fd, limit + 1 - len(data))):
            data += block
        return data
    finally:
        os.close(fd)


def read_text(path: str, limit: int = MAX_BYTES) -> str | None:
    """The stripped contents of ``path`` (UTF-8, bad bytes replaced), or None if it cannot
    be read: missing, a driver refusing the read (e.g. EINVAL for a port that is down),
    not a regular file (never waited on: a FIFO does not block; counted in :data:`BAD`),
    or longer than ``limit`` bytes (counted)."""
    try:
        data = read_head(path, limit)
    except NotAFile:
        BAD.note(path, "not a regular file: not read")
        return None
    except OSError:
        return None
    if len(data) > limit:
        BAD.note(path, f"longer than {limit} bytes: not read")
        return None
    return data.decode(errors="replace").strip()


def parse_uint(raw: str) -> int | None:
    """``raw`` (stripped) as an unsigned 64-bit counter (decimal or ``0x`` hex), else
    None: a sign, a fraction, an exponent, ``_``, non-ASCII digits or a value past
    ``2**64 - 1`` is no counter."""
    if not UINT.fullmatch(raw):
        return None
    value = int(raw, 16) if raw.startswith("0x") else int(raw)
    return value if value < _U64 else None


def read_int(path: str) -> int | None:
    """``path``'s contents as an unsigned 64-bit integer (:func:`parse_uint`), else None;
    content that is there but no such number is counted and logged once (:data:`BAD`)."""
    raw = read_text(path)
    if not raw:
        return None
    value = parse_uint(raw)
    if value is None:
        BAD.note(path, f"{raw[:40]!r} is no unsigned 64-bit counter: not read")
    return value


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
    got = parse_uint(value) if value else None
    return got if got is not None and got < 1 << 16 else -1
