"""Read the records ranks leave in the node's spool, exactly once across agent restarts.

Each spool file is JSON lines: a header line (run_id, attempt, rank), then one record a
line. The tailer reads complete lines only, past the last committed offset, and commits
new offsets to ``<spool_dir>/.agent-offsets-<key>.json`` (atomic rename) only after the
store has taken the batch, so an agent killed mid-batch re-reads it on restart. ``key``
names the destination (a hash of the store URL): an agent shipping the same spool to
another store starts from the beginning.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
from dataclasses import dataclass, field

from ranksight.trainer_hooks.spool import HEADER_TABLE

from .records import Batch


def offsets_file(key: str) -> str:
    """Name of the offsets file for destination ``key`` (e.g. a store URL)."""
    return f".agent-offsets-{hashlib.sha1(key.encode()).hexdigest()[:10]}.json"


@dataclass
class _FileState:
    offset: int = 0
    base: dict | None = None


@dataclass
class SpoolTailer:
    """Tails every ``<spool_dir>/<run_id>/a<attempt>/*.jsonl`` file."""

    spool_dir: str
    key: str = ""
    """The destination these offsets are for (the store URL)."""
    max_bytes: int = 64 << 20
    """Most bytes read in one :meth:`read` call, across files."""
    _files: dict[str, _FileState] = field(default_factory=dict)
    _pending: dict[str, _FileState] = field(default_factory=dict)

    def __post_init__(self) -> None:
        os.makedirs(self.spool_dir, mode=0o700, exist_ok=True)
        try:
            with open(os.path.join(self.spool_dir, offsets_file(self.key))) as f:
                saved = json.load(f)
            for path, st in saved.items():
                self._files[path] = _FileState(int(st["offset"]), st.get("base"))
        except FileNotFoundError:
            pass
        except (OSError, ValueError, KeyError, TypeError):
            pass  # a damaged offsets file: re-read from the start (at-least-once)

    def paths(self) -> list[str]:
        """Spool files present now, sorted."""
        return sorted(glob.glob(os.path.join(self.spool_dir, "*", "a*", "*.jsonl")))

    def read(self) -> Batch:
        """Records appended since the last commit, validated into a :class:`Batch`."""
        batch, budget = Batch(), self.max_bytes
        self._pending = {}
        for path in self.paths():
            if budget <= 0:
                break
            st = self._files.get(path, _FileState())
            try:
                with open(path, "rb") as f:
                    f.seek(st.offset)
                    chunk = f.read(budget)
            except OSError as e:
                batch.rejected.append(f"{path}: {e}")
                continue
            end = chunk.rfind(b"\n") + 1
            if end == 0:
                continue
            budget -= end
            new = _FileState(st.offset + end, st.base)
            for raw in chunk[:end].splitlines():
                self._parse_line(raw, new, batch, path)
            self._pending[path] = new
        return batch

    @staticmethod
    def _parse_line(raw: bytes, st: _FileState, batch: Batch, path: str) -> None:
        try:
            rec = json.loads(raw)
            if not isinstance(rec, dict):
                raise ValueError("not a JSON object")
        except ValueError as e:
            batch.rejected.append(f"{os.path.basename(path)}: malformed line ({e})")
            return
        if rec.get("t") == HEADER_TABLE:
            st.base = {k: rec[k] for k in ("run_id", "attempt", "rank") if k in rec}
            return
        if st.base is None:
            batch.rejected.append(f"{os.path.basename(path)}: record before header")
            return
        batch.add(rec, st.base)

    def commit(self) -> None:
        """Make the offsets of the last :meth:`read` durable."""
        self._files.update(self._pending)
        self._pending = {}
        path = os.path.join(self.spool_dir, offsets_file(self.key))
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump({p: {"offset": s.offset, "base": s.base} for p, s in self._files.items()}, f)
        os.replace(tmp, path)
