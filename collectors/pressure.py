"""The kernel's pressure stall information (PSI): how much of the wall time the host's tasks
waited for a core, for memory or for I/O -> ``host_pressure``, one row per resource and
sample.

Format (Linux >= 4.20, Documentation/accounting/psi.rst; ``full`` for cpu since 5.13, the
``irq`` file since 6.1 with a ``full`` line only)::

    $ cat /proc/pressure/cpu
    some avg10=6.66 avg60=33.82 avg300=19.93 total=8601574067
    full avg10=0.00 avg60=0.00 avg300=0.00 total=0

``avgN`` is the share (%) of the last N seconds in which at least one task (``some``) or
every non-idle task at once (``full``) was stalled on the resource; ``total`` is the
stalled time since boot in microseconds. A kernel booted with ``psi=0`` lists the files
and refuses their reads (EOPNOTSUPP): the collector is then unavailable. A line or field
that is not in this form is left empty (NaN, -1) and counted in ``sysfs.BAD``, never a
crash.
"""

from __future__ import annotations

import math
import os
import re

from .base import EMPTY, Collector, NodeContext, Rows, Unavailable
from .sysfs import BAD, read_text

RESOURCES = ("cpu", "memory", "io", "irq")
"""The files under ``/proc/pressure`` read, where the kernel has them."""

_FIELD = re.compile(r"(avg10|avg60|avg300|total)=(\S+)")


def parse(text: str, where: str = "pressure") -> dict[str, float | int]:
    """One PSI file's text -> ``{some_avg10, some_avg60, some_avg300, some_total_us,
    full_avg10, ...}``: averages in % (0-100; NaN where missing or out of range), totals
    in us (-1 where missing). ``where`` names the file in :data:`sysfs.BAD`'s counts."""
    out: dict[str, float | int] = {}
    for kind in ("some", "full"):
        for avg in ("avg10", "avg60", "avg300"):
            out[f"{kind}_{avg}"] = EMPTY
        out[f"{kind}_total_us"] = -1
    for line in text.splitlines():
        kind, _, rest = line.strip().partition(" ")
        if kind not in ("some", "full"):
            if line.strip():
                BAD.note(where, f"{line[:60]!r} is no PSI line: not read")
            continue
        for name, raw in _FIELD.findall(rest):
            if name == "total":
                if raw.isdigit() and int(raw) < 1 << 63:
                    out[f"{kind}_total_us"] = int(raw)
                else:
                    BAD.note(where, f"total={raw[:30]!r} is no count of microseconds")
                continue
            try:
                value = float(raw)
            except ValueError:
                value = math.nan
            if math.isfinite(value) and 0.0 <= value <= 100.0:
                out[f"{kind}_{name}"] = value
            else:
                BAD.note(where, f"{name}={raw[:30]!r} is no share of 0-100%")
    return out


class PressureCollector(Collector):
    """``host_pressure`` from ``<proc_root>/pressure/{cpu,memory,io,irq}`` every
    ``interval_s`` seconds."""

    name = "pressure"
    tables = ("host_pressure",)

    def __init__(
        self, ctx: NodeContext, *, interval_s: float = 1.0, proc_root: str = "/proc"
    ) -> None:
        if interval_s <= 0:
            raise ValueError(f"pressure interval_s must be > 0, got {interval_s}")
        self.ctx = ctx
        self.interval_s = interval_s
        self.folder = os.path.join(proc_root, "pressure")
        self.resources: tuple[str, ...] = ()

    def open(self) -> None:
        """Find the readable PSI files. Raises Unavailable if there are none (a kernel
        before 4.20, or one booted with ``psi=0``)."""
        self.resources = tuple(
            r for r in RESOURCES if read_text(os.path.join(self.folder, r)) is not None
        )
        if not self.resources:
            raise Unavailable(
                f"no readable pressure stall information in {self.folder} "
                "(a kernel before 4.20, or booted with psi=0)"
            )

    def collect(self, now_ns: int) -> Rows:
        """One row per resource whose file reads now."""
        rows = []
        for resource in self.resources:
            path = os.path.join(self.folder, resource)
            text = read_text(path)
            if text is None:
                continue
            rows.append({"host": self.ctx.host, "ts_ns": now_ns, "resource": resource,
                         **parse(text, path)})  # fmt: skip
        return {"host_pressure": rows}
