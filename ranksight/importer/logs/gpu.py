"""GPU and host errors: what a node's kernel log, NVML and the CUDA runtime say.

==========================  =========================================  ==========
line                        example                                    category
==========================  =========================================  ==========
XID (dmesg, syslog)         ``NVRM: Xid (PCI:0000:3b:00): 79, pid=..``  ``xid``
CUDA ECC                    ``CUDA error: uncorrectable ECC error``     ``ecc``
NVML                        ``Unable to determine the device handle     ``nvml``
                            for GPU 0000:3B:00.0: Unknown Error``
PCIe AER                    ``pcieport 0000:00:03.1: AER: Uncorrected   ``aer``
                            (Fatal) error received: 0000:3b:00.0``
CUDA device errors          ``CUDA error: an illegal memory access``    ``cuda``
                            ``CUDA error: unspecified launch failure``
ROCm HSA (AMD)              ``HW Exception by GPU node-9 (Agent handle: ``hsa``
                            0x64ff..) reason :GPU Hang``
==========================  =========================================  ==========

Each becomes a ``gpu_error`` event: ``detail`` ``category``, ``device`` (PCI bus id,
lower case, or ``cuda:N``), ``xid``/``severity``/``message``; ``code`` the XID; ``host``
from the line (a syslog ``Mon DD HH:MM:SS host kernel:`` prefix, pdsh) where it says; the
rank as the watchdog's lines give it (``what():  [PG ID 0 PG GUID 0(default_pg) Rank 2]
Process group watchdog thread terminated with exception: CUDA error: ...`` is global rank
2: :func:`.watchdog.global_rank`), the rank inside another group as ``group_rank``.
XIDs are read with NVIDIA's XID catalog in mind (docs.nvidia.com/deploy/xid-errors):
48 (double-bit ECC), 63/64 (row remapping), 74 (NVLink), 79 (fallen off the bus),
92/94/95 (ECC), 119/120 (GSP) are hardware; 13, 31, 43 are usually the application's.
"""

from __future__ import annotations

import re
from typing import Any

from . import watchdog
from .events import Event
from .lines import LogLine

HARDWARE_XIDS = frozenset({48, 61, 62, 63, 64, 68, 69, 74, 79, 92, 94, 95, 119, 120, 140})
"""XIDs that point at the GPU, its memory, NVLink or its firmware (NVIDIA's XID catalog)."""
_XID = re.compile(r"NVRM: Xid \((?:PCI:)?(?P<bus>[0-9A-Fa-f:.]+)\):\s*(?P<xid>\d+),?\s*(?P<msg>.*)")
_SYSLOG = re.compile(r"^\w{3}\s+\d+\s+\d\d:\d\d:\d\d\s+(?P<host>[\w.-]+)\s+kernel:")
_NVML = re.compile(r"Unable to determine the device handle for (?:GPU|gpu)\s*(?P<bus>[0-9A-Fa-f:.]+)"
                   r":\s*(?P<msg>.+)")  # fmt: skip
_AER = re.compile(
    r"(?P<port>[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.\d)[:\s]+(?:PCIe Bus Error: "
    r"severity=|AER: )(?P<sev>(?:Multiple )?(?:Uncorrected|Corrected)[^,\n]*?)(?:error|,|$)"
    r"(?:.*?received:?\s*(?:id=)?(?P<src>[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.\d))?"
)
_CUDA = re.compile(
    r"(?:CUDA error: |cuda runtime error \(\d+\) : )(?P<msg>uncorrectable ECC error encountered|an illegal memory access was "
    r"encountered|unspecified launch failure|an illegal instruction was encountered|"
    r"misaligned address|unknown error|device-side assert triggered|"
    r"the launch timed out and was terminated)"
)
_FELL = re.compile(r"GPU (?P<bus>[0-9A-Fa-f:.]+)? ?has fallen off the bus")
_HSA = re.compile(
    r"HW Exception by GPU node-(?P<node>\d+) \(Agent handle: [^)]*\) reason :\s*(?P<reason>.+)"
)
"""ROCm's HSA runtime on an AMD GPU fault (ROCm legacy-rocm-build#4021, MI300X: ``HW
Exception by GPU node-9 (Agent handle: 0x64ff272d8ab0) reason :GPU Hang``): the device,
named by its KFD node, reports a hang or a memory fault."""
MARKERS = ("HW Exception by GPU", "Xid", "device handle", "AER", "PCIe Bus Error", "CUDA error", "cuda runtime error",
           "fallen off the bus")  # fmt: skip


def _bus(text: str) -> str:
    """A PCI bus id as NVML writes it, lower case: ``0000:3b:00.0``."""
    b = text.lower().rstrip(".:")
    return b if re.fullmatch(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}(\.\d)?", b) else b


def parse(line: LogLine) -> list[Event]:
    """The ``gpu_error`` events of one logical line."""
    t = line.text
    host = line.host or ((m.group("host")) if (m := _SYSLOG.search(t)) else "")
    pg, name, grank = watchdog.group_of(t)
    base: dict[str, Any] = dict(
        rank=watchdog.global_rank(line, pg, name, grank),
        local_rank=line.local_rank,
        group_rank=grank,
        host=host,
        line=line.number,
        text=t,
    )
    if m := _XID.search(t):
        xid = int(m.group("xid"))
        return [Event("gpu_error", **base, code=xid,
                      detail={"category": "xid", "device": _bus(m.group("bus")),
                              "hardware": xid in HARDWARE_XIDS, "message": m.group("msg")[:120]})]  # fmt: skip
    if m := _NVML.search(t):
        return [Event("gpu_error", **base, detail={"category": "nvml",
                      "device": _bus(m.group("bus")), "hardware": True,
                      "message": m.group("msg").strip()[:120]})]  # fmt: skip
    if m := _AER.search(t):
        sev = m.group("sev").strip()
        dev = _bus(m.group("src") or m.group("port"))
        return [Event("gpu_error", **base, detail={"category": "aer", "device": dev,
                      "severity": sev, "hardware": sev.lower().startswith(("uncorrected",
                      "multiple uncorrected")), "message": sev})]  # fmt: skip
    if m := _CUDA.search(t):
        msg = m.group("msg")
        cat = "ecc" if "ECC" in msg else "cuda"
        return [Event("gpu_error", **base, detail={"category": cat, "device": "",
                      "hardware": cat == "ecc", "message": msg})]  # fmt: skip
    if m := _HSA.search(t):
        return [Event("gpu_error", **base, detail={"category": "hsa", "device": f"KFD node {m.group('node')}",
                      "hardware": True, "message": m.group("reason").strip()[:120]})]  # fmt: skip
    if m := _FELL.search(t):
        return [Event("gpu_error", **base, detail={"category": "xid", "hardware": True,
                      "device": _bus(m.group("bus") or ""), "message": "fallen off the bus"})]  # fmt: skip
    return []
