"""A crash-proof record of a rank's last collectives: a small memory-mapped ring file.

Records reach the spool through a writer thread every few hundred milliseconds, so the
ops a rank was inside when it was killed outright (SIGKILL, the OOM killer, a segfault,
gloo's SIGABRT on a size mismatch, ``os._exit``) would be lost with it; yet they are what
tells a desync from a crash. So every op is also written, at issue, into a shared
memory-mapped file beside the spool file (a few stores into the page cache, ~1 µs), and
its end time when it completes. The kernel keeps a dead process's mapped pages, so the
node agent (``collectors/postmortem.py``) reads the ops still in flight after the process
is gone. Like the Flight Recorder's ring buffer, but readable after death, without asking
the dead process for a dump.

Layout (little-endian): a 64-byte header ``HEADER`` (magic, slot count, ops written,
``flushed`` = 1 once the hooks themselves wrote their in-flight ops to the spool, the step
the rank is in, the time of its last op or step start), then
``slots`` fixed slots ``SLOT`` of one op each; op ``n`` is in slot ``n % slots``.
"""

from __future__ import annotations

import mmap
import os
import struct
from typing import Any

MAGIC = b"RSBBOX1\0"
HEADER = struct.Struct("<8sqqqqq16x")
"""magic, slots, ops written (serial of the next op), flushed, step, last_ns."""
SLOT = struct.Struct("<qqqqqqqii16s16s24s16s128s")
"""serial + 1 (0: empty), group_seq, enqueue_ns, end_ns (0: in flight), numel_in,
numel_out, bytes, step, peer, group_id, op, dtype, phase, group_ranks (cut at 128 bytes:
empty when longer)."""
_END = struct.calcsize("<qqq")
SLOTS = 64
"""Ops kept: enough for every group's last few ops on a 3D-parallel rank."""
FIELDS = (
    "serial",
    "group_seq",
    "enqueue_ns",
    "end_ns",
    "numel_in",
    "numel_out",
    "bytes",
    "step",
    "peer",
    "group_id",
    "op",
    "dtype",
    "phase",
    "group_ranks",
)


def blackbox_path(spool_file: str, rank: int) -> str:
    """``blackbox-rank<rank:05d>-<pid>.bin`` beside this process's spool file."""
    return os.path.join(os.path.dirname(spool_file), f"blackbox-rank{rank:05d}-{os.getpid()}.bin")


_TEXT: dict[tuple[Any, ...], tuple[bytes, ...]] = {}
"""(group id, op, dtype, phase, group ranks) -> their encoded slot fields: the few
distinct combinations are encoded once."""


def _b(s: Any, n: int) -> bytes:
    """``s`` as at most ``n`` UTF-8 bytes (empty when longer)."""
    b = str(s).encode("utf-8", "replace")
    return b if len(b) <= n else b""


class BlackBox:
    """The writer side, used by the training process. Never raises after ``__init__``
    (which raises OSError if the file cannot be created)."""

    def __init__(self, path: str, slots: int = SLOTS) -> None:
        self.path = path
        self.slots = slots
        size = HEADER.size + slots * SLOT.size
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.ftruncate(fd, size)
            self._mm = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self._n = 0
        self._where: dict[int, tuple[int, int]] = {}
        """id(record) -> (serial, offset) of ops not yet completed."""
        HEADER.pack_into(self._mm, 0, MAGIC, slots, 0, 0, -1, 0)

    def set_step(self, step: int, now_ns: int) -> None:
        """The rank began ``step`` at ``now_ns``."""
        try:
            struct.pack_into("<qq", self._mm, 32, step, now_ns)
        except (ValueError, struct.error):
            pass

    def issued(self, rec: dict[str, Any]) -> None:
        """Write ``rec`` (a ``collectives`` record) into the next slot."""
        n = self._n
        self._n = n + 1
        off = HEADER.size + (n % self.slots) * SLOT.size
        try:
            key = (rec["group_id"], rec["op"], rec["dtype"], rec["phase"], rec["group_ranks"])
            text = _TEXT.get(key)
            if text is None:
                text = (
                    _b(key[0], 16),
                    _b(key[1], 16),
                    _b(key[2], 24),
                    _b(key[3], 16),
                    _b(key[4], 128),
                )
                if len(_TEXT) < 4096:
                    _TEXT[key] = text
            SLOT.pack_into(
                self._mm, off, n + 1, rec["group_seq"], rec["enqueue_ns"], 0,
                rec["numel_in"], rec["numel_out"], rec["bytes"], rec["step"], rec["peer"], *text,
            )  # fmt: skip
            struct.pack_into("<q", self._mm, 16, n + 1)
            struct.pack_into("<q", self._mm, 40, rec["enqueue_ns"])
        except (ValueError, TypeError, struct.error):
            return
        self._where[id(rec)] = (n + 1, off)
        if len(self._where) > 4 * self.slots:  # never completed: forget the oldest
            self._where.pop(next(iter(self._where)))

    def completed(self, rec: dict[str, Any]) -> None:
        """Write ``rec``'s end time into its slot, if the slot still holds it."""
        where = self._where.pop(id(rec), None)
        if where is None:
            return
        serial, off = where
        try:
            if struct.unpack_from("<q", self._mm, off)[0] == serial:
                struct.pack_into("<q", self._mm, off + _END, int(rec["end_ns"]))
        except (ValueError, struct.error):
            pass

    def mark_flushed(self) -> None:
        """The hooks wrote their in-flight ops to the spool themselves: nothing to recover."""
        try:
            struct.pack_into("<q", self._mm, 24, 1)
        except (ValueError, struct.error):
            pass

    def close(self) -> None:
        """Unmap and delete the file (a clean end: nothing to recover)."""
        try:
            self._mm.close()
            os.unlink(self.path)
        except (OSError, ValueError):
            pass


def read_blackbox(path: str) -> tuple[dict[str, int], list[dict[str, Any]]]:
    """``(header, ops)`` of a black box file, oldest op first; ``header`` has ``slots``,
    ``written``, ``flushed``, ``step`` and ``last_ns``. Raises ValueError naming the file if it is not one
    (wrong magic, truncated) and OSError if it cannot be read."""
    with open(path, "rb") as f:
        return parse_blackbox(f.read(), path)


def parse_blackbox(data: bytes, path: str) -> tuple[dict[str, int], list[dict[str, Any]]]:
    """:func:`read_blackbox` of the bytes of the file at ``path`` (named in errors)."""
    if len(data) < HEADER.size:
        raise ValueError(f"{path}: {len(data)} bytes is too short for a black box header")
    magic, slots, written, flushed, step, last_ns = HEADER.unpack_from(data, 0)
    if magic != MAGIC:
        raise ValueError(f"{path}: not a ranksight black box (magic {magic!r})")
    if len(data) < HEADER.size + slots * SLOT.size:
        raise ValueError(f"{path}: truncated ({len(data)} bytes for {slots} slots)")
    ops = []
    for i in range(slots):
        values = SLOT.unpack_from(data, HEADER.size + i * SLOT.size)
        if values[0] == 0:
            continue
        op = dict(zip(FIELDS, values, strict=True))
        for k in ("group_id", "op", "dtype", "phase", "group_ranks"):
            op[k] = op[k].rstrip(b"\0").decode("utf-8", "replace")
        op["serial"] -= 1
        ops.append(op)
    ops.sort(key=lambda o: o["serial"])
    header = {"slots": slots, "written": written, "flushed": flushed}
    return {**header, "step": step, "last_ns": last_ns}, ops
