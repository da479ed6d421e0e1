"""Read the records ranks leave in the node's spool, each exactly once across restarts.

Each spool file ``<spool>/<run_id>/a<attempt>/rank<r>-<pid>.jsonl`` is JSON lines: a
header line (run_id, attempt, rank), then one record a line. The tailer reads complete
lines only, past each file's offset, and parses them (``agent/parse.py``). The offsets of
a read become durable in two ways: inside the batch the agent seals from it (its
manifest carries them, ``agent/buffer.py``), then in ``<state>/offsets.json`` (atomic
rename) with the sequence number of the last batch they include. On start, batches newer
than that number re-apply their offsets, so a crash between the two loses nothing and
reads nothing twice.

A line longer than :data:`MAX_LINE` bytes is skipped and counted as rejected. Files not
owned by the agent's user are skipped (see ``agent/security.py``).
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
from dataclasses import dataclass, field

import numpy as np

from .parse import Parsed, parse_chunk

OFFSETS = "offsets.json"
MAX_LINE = 8 << 20
"""Longest spool line read, bytes (a record with strings at ``records.MAX_STRING``)."""


def state_dir_for(spool_dir: str, key: str) -> str:
    """The agent's folder for destination ``key`` (a store URL): ``<spool>/.agent-<hash>``."""
    return os.path.join(spool_dir, f".agent-{hashlib.sha1(key.encode()).hexdigest()[:10]}")


@dataclass
class FileState:
    """How far one spool file has been read, and its header."""

    offset: int = 0
    base: dict | None = None


@dataclass
class SpoolTailer:
    """Tails every ``<spool_dir>/<run_id>/a<attempt>/*.jsonl`` file."""

    spool_dir: str
    key: str = ""
    """The destination these offsets are for (the store URL)."""
    state_dir: str | None = None
    """Where ``offsets.json`` lives; default :func:`state_dir_for`."""
    fsync: bool = False
    """fsync the offsets file on commit."""
    files: dict[str, FileState] = field(default_factory=dict)
    seq: int = 0
    """Sequence number of the last sealed batch the committed offsets include."""
    lines_read: int = 0
    """Lines the last :meth:`read` consumed (records, headers and rejected lines)."""
    _pending: dict[str, FileState] = field(default_factory=dict)
    _start: int = 0
    _line_bytes: float = 512.0  # running mean line length: how much to read for N lines

    def __post_init__(self) -> None:
        self.state_dir = self.state_dir or state_dir_for(self.spool_dir, self.key)
        os.makedirs(self.state_dir, mode=0o700, exist_ok=True)
        try:
            with open(os.path.join(self.state_dir, OFFSETS)) as f:
                saved = json.load(f)
            self.seq = int(saved["seq"])
            self.apply(saved["files"])
        except FileNotFoundError:
            pass
        except (OSError, ValueError, KeyError, TypeError):
            pass  # a damaged offsets file: re-read from the start (at-least-once)

    def apply(self, offsets: dict) -> None:
        """Take ``{path: {"offset", "base"}}`` (an offsets file, or a batch manifest)."""
        for path, st in offsets.items():
            self.files[path] = FileState(int(st["offset"]), st.get("base"))

    def paths(self) -> list[str]:
        """Spool files present now, sorted."""
        return sorted(glob.glob(os.path.join(self.spool_dir, "*", "a*", "*.jsonl")))

    def read(self, max_lines: int | None = None, max_bytes: int = 256 << 20) -> Parsed:
        """Records appended since the last :meth:`commit`, at most ``max_lines`` lines and
        about ``max_bytes`` bytes, parsed; files are visited round-robin so that one busy
        file cannot starve the others. :meth:`pending` has the offsets after it."""
        out, self._pending, self.lines_read = Parsed(), {}, 0
        paths = self.paths()
        present = set(paths)
        for gone in [p for p in self.files if p not in present]:  # deleted spool files
            del self.files[gone]
        if paths:
            self._start %= len(paths)
            paths = paths[self._start :] + paths[: self._start]
            self._start += 1
        lines_left = max_lines if max_lines is not None else 1 << 62
        for path in paths:
            if lines_left <= 0 or max_bytes <= 0:
                break
            st = self.files.get(path, FileState())
            n_lines, n_bytes = self._read_file(path, st, lines_left, max_bytes, out)
            lines_left, max_bytes = lines_left - n_lines, max_bytes - n_bytes
            self.lines_read += n_lines
        return out

    def _read_file(
        self, path: str, st: FileState, max_lines: int, max_bytes: int, out: Parsed
    ) -> tuple[int, int]:
        """Read and parse one file's new complete lines into ``out``; (lines, bytes)."""
        try:
            with open(path, "rb") as f:
                if os.fstat(f.fileno()).st_uid != os.getuid():
                    return 0, 0
                f.seek(st.offset)
                want = min(max_bytes, int(max_lines * self._line_bytes * 1.25) + (64 << 10))
                chunk = f.read(max(want, MAX_LINE))
        except OSError as e:
            out.rejected.append(f"{path}: {e}")
            return 0, 0
        end = _cut(chunk, max_lines)
        if end == 0:
            if len(chunk) >= MAX_LINE:  # one line longer than any record may be
                skip = _skip_line(path, st.offset)
                out.rejected.append(f"{os.path.basename(path)}: line over {MAX_LINE} bytes")
                self._pending[path] = FileState(st.offset + skip, st.base)
                return 1, skip
            return 0, 0
        lines = chunk.count(b"\n", 0, end)
        self._line_bytes = max(64.0, 0.8 * self._line_bytes + 0.2 * end / lines)
        parsed = parse_chunk(chunk[:end], st.base, path)
        out.extend(parsed)
        self._pending[path] = FileState(st.offset + end, parsed.base)
        return lines, end

    def pending(self) -> dict:
        """Offsets after the last :meth:`read`, for files it advanced (JSON-ready)."""
        return {p: {"offset": s.offset, "base": s.base} for p, s in self._pending.items()}

    def commit(self, seq: int | None = None) -> None:
        """Make the offsets of the last :meth:`read` durable (with batch ``seq``)."""
        self.files.update(self._pending)
        self._pending = {}
        if seq is not None:
            self.seq = max(self.seq, seq)
        self.save()

    def save(self) -> None:
        """Write ``offsets.json`` (temp file, optional fsync, rename)."""
        path = os.path.join(self.state_dir, OFFSETS)
        tmp = path + ".tmp"
        files = {p: {"offset": s.offset, "base": s.base} for p, s in self.files.items()}
        with open(tmp, "w") as f:
            json.dump({"seq": self.seq, "files": files}, f)
            if self.fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)


def _cut(chunk: bytes, max_lines: int) -> int:
    """Bytes of ``chunk`` up to its last complete line, at most ``max_lines`` lines."""
    end = chunk.rfind(b"\n") + 1
    if end == 0 or chunk.count(b"\n", 0, end) <= max_lines:
        return end
    newlines = np.flatnonzero(np.frombuffer(chunk, dtype=np.uint8, count=end) == 10)
    return int(newlines[max_lines - 1]) + 1


def _skip_line(path: str, offset: int) -> int:
    """Bytes from ``offset`` to just past the next newline (to the end if none yet)."""
    skipped = 0
    with open(path, "rb") as f:
        f.seek(offset)
        while block := f.read(1 << 20):
            at = block.find(b"\n")
            if at >= 0:
                return skipped + at + 1
            skipped += len(block)
    return skipped
