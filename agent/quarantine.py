"""The quarantine folder: spool bytes that broke decoding, kept aside for a person to read.

``<state>/quarantine/`` holds one ``<spool path>@<offset>.bad`` file per poisoned line or
frame (``agent/poison.py``; the path relative to the spool, ``/`` as ``~``), its first
:data:`MAX_ITEM_BYTES` bytes, and ``index.jsonl``: one line per item (source, offset,
bytes, records, reason, file). The name is fixed by where the bytes lie, so an item read
again (the agent restarted before its offsets were committed) is not kept twice, and is
not logged twice. The folder is bounded: past :data:`MAX_BYTES` items are indexed and
counted but not copied. Keeping an item never raises: a full disk costs the copy only.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re

from .poison import Poison

log = logging.getLogger("ranksight.agent")

FOLDER = "quarantine"
INDEX = "index.jsonl"
MAX_ITEM_BYTES = 8 << 20
"""Bytes of one item copied (a spool line is at most ``tailer.MAX_LINE``, 8 MiB)."""
MAX_BYTES = 64 << 20
"""Bound on the folder's size, bytes: items past it are indexed, not copied."""
_UNSAFE = re.compile(r"[^A-Za-z0-9._~-]")


class Quarantine:
    """The quarantine folder under ``state_dir`` (created on first use)."""

    def __init__(self, state_dir: str, spool_dir: str) -> None:
        self.folder = os.path.join(state_dir, FOLDER)
        self.spool_dir = spool_dir
        self._bytes: int | None = None  # folder size, read on first use

    def keep(self, poison: Poison) -> Poison:
        """Copy ``poison`` into the folder (unless there already); returns it with
        ``kept`` (its file) and ``new`` (False if it was there before) set."""
        name = self._name(poison)
        path = os.path.join(self.folder, name)
        if os.path.exists(path):
            return dataclasses.replace(poison, kept=path, new=False)
        try:
            os.makedirs(self.folder, mode=0o700, exist_ok=True)
            if self._bytes is None:
                self._bytes = _folder_bytes(self.folder)
            data = poison.data[:MAX_ITEM_BYTES] if self._bytes < MAX_BYTES else b""
            _write_new(path, data)
            self._bytes += len(data)
            self._index(poison, name)
        except OSError as exc:
            log.warning("cannot keep quarantined bytes in %s: %s", self.folder, exc)
            return dataclasses.replace(poison, kept="")
        return dataclasses.replace(poison, kept=path)

    def _name(self, poison: Poison) -> str:
        """``<path relative to the spool, / as ~>@<offset>.bad``, at most 255 bytes."""
        rel = os.path.relpath(poison.source, self.spool_dir) if poison.source else "unknown"
        stem = _UNSAFE.sub("_", rel.replace(os.sep, "~"))
        return f"{stem[-200:]}@{poison.offset}.bad"

    def _index(self, poison: Poison, name: str) -> None:
        entry = {
            "source": poison.source, "offset": poison.offset, "bytes": len(poison.data),
            "records": poison.records, "reason": poison.reason, "file": name,
        }  # fmt: skip
        with open(os.path.join(self.folder, INDEX), "a") as f:
            f.write(json.dumps(entry) + "\n")


def _write_new(path: str, data: bytes) -> None:
    """Write ``path`` whole or not at all (temp file, then rename)."""
    tmp = f"{path}.tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _folder_bytes(folder: str) -> int:
    """Bytes of the files in ``folder``."""
    total = 0
    for entry in os.scandir(folder):
        try:
            total += entry.stat().st_size
        except OSError:
            pass
    return total
