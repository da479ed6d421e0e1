"""Read the records ranks leave in the node's spool, each exactly once across restarts.

The hooks write binary segments ``<spool>/<run_id>/a<attempt>/rank<r>-<pid>-<n>.spool``
(``trainer_hooks/spool_format.py``): a header frame (run_id, attempt, rank), frames of
columnar records, and an end frame once the writer moved on. The tailer reads complete
frames only, past each file's offset, and decodes them (``agent/segment.py``): a damaged
frame is rejected (logged, counted) and reading goes on at the next frame; one that breaks
decoding is quarantined (``agent/poison.py``, ``agent/quarantine.py``). An incomplete
frame at the end of a segment unchanged for a while is a damaged length if a whole frame
follows it (skipped), else, once its writer is gone, truncated. A segment read to its end
frame (or whose writer is gone) is *sealed*: nothing more will come, and the agent may
delete it once the store has it. Nothing a file holds makes :meth:`SpoolTailer.read`
raise: one file never stops the others.

JSON spool files ``rank<r>-<pid>.jsonl`` (older hooks, hand-written producers) are still
read: a header line, then one record a line; complete lines only. The offsets of
a read become durable in two ways: inside the batch the agent seals from it (its
manifest carries them, ``agent/buffer.py``), then in ``<state>/offsets.json`` (atomic
rename) with the sequence number of the last batch they include. On start, batches newer
than that number re-apply their offsets, so a crash between the two loses nothing and
reads nothing twice.

A line longer than :data:`MAX_LINE` bytes is skipped and counted as rejected. Files not
owned by the agent's user are skipped (see ``ranksight/ground/ownership.py``).
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import json
import os
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ranksight.trainer_hooks import spool_format as sf

from .parse import Parsed, parse_chunk
from .poison import Poison
from .quarantine import Quarantine
from .segment import decode

OFFSETS = "offsets.json"
MAX_LINE = 8 << 20
"""Longest spool line read, bytes (a record with strings at ``records.MAX_STRING``)."""


def state_dir_for(spool_dir: str, key: str) -> str:
    """The agent's folder for destination ``key`` (a store URL): ``<spool>/.agent-<hash>``
    of the place it names (``store.url.canonical_target``), so that every spelling of one
    store shares one set of offsets and delivered batches."""
    return legacy_state_dir(spool_dir, target_of(key))


def target_of(key: str) -> str:
    """``canonical_target(key)`` (``key`` itself if empty or not a store URL)."""
    from ranksight.store import StoreError
    from ranksight.store.url import canonical_target

    try:
        return canonical_target(key) if key else key
    except StoreError:
        return key


def legacy_state_dir(spool_dir: str, key: str) -> str:
    """``<spool>/.agent-<hash of key as spelled>``: the folder of agents that keyed their
    state by the URL's text (before :func:`state_dir_for` canonicalized it)."""
    return os.path.join(spool_dir, f".agent-{hashlib.sha1(key.encode()).hexdigest()[:10]}")


_QUIET_S = 5.0
"""A segment unchanged this long, read to its end, whose writer process is gone, is sealed
(``"gone"``); should it grow after all (a writer in another pid namespace), it is read on."""
ABANDONED_S = 600.0
"""A ``"gone"`` segment is deleted (once stored) only when unchanged this long, seconds."""
_BASE = ("run_id", "attempt", "rank")


@dataclass
class FileState:
    """How far one spool file has been read, its header, and whether it is sealed:
    ``"end"`` (read to its end frame: nothing will follow), ``"gone"`` (read to the end of
    a segment whose writer is gone), or ``""``."""

    offset: int = 0
    base: dict | None = None
    sealed: str = ""


@dataclass
class SpoolTailer:
    """Tails every ``<spool_dir>/<run_id>/a<attempt>/*.jsonl`` file."""

    spool_dir: str
    key: str = ""
    """The destination these offsets are for (the store URL, any spelling)."""
    state_dir: str = ""
    """Where ``offsets.json`` lives; default (empty or None) :func:`state_dir_for`."""
    fsync: bool = False
    """fsync the offsets file on commit."""
    files: dict[str, FileState] = field(default_factory=dict)
    seq: int = 0
    """Sequence number of the last sealed batch the committed offsets include."""
    durable_seq: int = 0
    """The same, as far as ``offsets.json`` on disk has it (behind :attr:`seq` while the
    file cannot be written: batches past it must stay buffered, their manifests being
    the only durable record of their offsets)."""
    lines_read: int = 0
    """Lines the last :meth:`read` consumed (records, headers and rejected lines)."""
    quarantine: Quarantine | None = None
    """Where input that breaks decoding goes (default ``<state_dir>/quarantine``)."""
    _pending: dict[str, FileState] = field(default_factory=dict)
    _start: int = 0
    _line_bytes: float = 512.0  # running mean line length: how much to read for N lines
    _record_bytes: float = 256.0  # the same for binary segments

    def __post_init__(self) -> None:
        self.state_dir = self.state_dir or state_dir_for(self.spool_dir, self.key)
        os.makedirs(self.state_dir, mode=0o700, exist_ok=True)
        self.quarantine = self.quarantine or Quarantine(self.state_dir, self.spool_dir)
        try:
            with open(os.path.join(self.state_dir, OFFSETS)) as f:
                saved = json.load(f)
            self.seq = self.durable_seq = int(saved["seq"])
            self.apply(saved["files"])
        except FileNotFoundError:
            pass
        except (OSError, ValueError, KeyError, TypeError):
            pass  # a damaged offsets file: re-read from the start (at-least-once)

    def apply(self, offsets: dict) -> None:
        """Take ``{path: {"offset", "base"}}`` (an offsets file, or a batch manifest)."""
        for path, st in offsets.items():
            sealed = st.get("sealed") or ""
            self.files[path] = FileState(int(st["offset"]), st.get("base"), str(sealed))

    def paths(self) -> list[str]:
        """Spool files present now (binary segments and JSON files), sorted."""
        pattern = os.path.join(self.spool_dir, "*", "a*", "*")
        return sorted(p for p in glob.glob(pattern) if p.endswith((sf.SUFFIX, ".jsonl")))

    def read(self, max_lines: int | None = None, max_bytes: int = 256 << 20) -> Parsed:
        """Records appended since the last :meth:`commit`, at most ``max_lines`` lines and
        about ``max_bytes`` bytes, parsed; files are visited round-robin so that one busy
        file cannot starve the others. :meth:`pending` has the offsets after it. Never
        raises for what a file holds: input that breaks decoding is in
        ``quarantined``, each item kept in :attr:`quarantine` (``new``: not seen before)."""
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
            if st.sealed == "end" or (st.sealed == "gone" and _size(path) <= st.offset):
                continue
            n_lines, n_bytes = self._read_guarded(path, st, lines_left, max_bytes, out)
            lines_left, max_bytes = lines_left - n_lines, max_bytes - n_bytes
            self.lines_read += n_lines
        quarantine = self.quarantine
        assert quarantine is not None  # set by __post_init__
        out.quarantined = [quarantine.keep(p) for p in out.quarantined]
        return out

    def _read_guarded(
        self, path: str, st: FileState, max_lines: int, max_bytes: int, out: Parsed
    ) -> tuple[int, int]:
        """Read one file into ``out``. Should reading it raise all the same (the decoders
        catch what one record or frame may raise: this is the last resort), the bytes past
        its offset are quarantined whole and skipped, so one file never stops the others."""
        read = self._read_segment if path.endswith(sf.SUFFIX) else self._read_file
        local = Parsed()
        try:
            found = read(path, st, max_lines, max_bytes, local)
        except Exception as exc:  # noqa: BLE001 - never let one file stop the agent
            size = min(_size(path) - st.offset, max(max_bytes, 1))
            if size <= 0:
                return 0, 0
            with open(path, "rb") as f:
                f.seek(st.offset)
                data = f.read(size)
            why = f"{os.path.basename(path)}: {type(exc).__name__} reading it ({exc!s:.80})"
            out.quarantined.append(Poison(why, data, st.offset, 1, path))
            self._pending[path] = FileState(st.offset + len(data), st.base, st.sealed)
            return 1, len(data)
        out.extend(local)
        return found

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
        parsed.quarantined = [p.moved(st.offset, path) for p in parsed.quarantined]
        out.extend(parsed)
        self._pending[path] = FileState(st.offset + end, parsed.base)
        return lines, end

    def _read_segment(
        self, path: str, st: FileState, max_rows: int, max_bytes: int, out: Parsed
    ) -> tuple[int, int]:
        """Read one binary segment's new complete frames into ``out``, at least one frame
        and then up to about ``max_rows`` records; (records and frames, bytes)."""
        label = os.path.basename(path)
        want = min(max_bytes, int(max_rows * self._record_bytes * 1.25) + (64 << 10))
        try:
            with open(path, "rb") as f:
                stat = os.fstat(f.fileno())
                if stat.st_uid != os.getuid():
                    return 0, 0
                f.seek(st.offset)
                chunk = f.read(want)
                if len(chunk) >= sf.FRAME_BYTES and len(chunk) == want:
                    need = _first_frame_bytes(chunk)  # one frame bigger than the read
                    if need > len(chunk):
                        chunk += f.read(need - len(chunk))
        except OSError as e:
            out.rejected.append(f"{path}: {e}")
            return 0, 0
        got = decode(chunk, st.offset, st.base, max_rows, path, out)
        base, sealed, rows, used, full = got.base, got.sealed, got.rows, got.used, got.full
        out.quarantined = [p.moved(0, path) for p in out.quarantined]
        end = st.offset + used
        if not sealed and end == stat.st_size and time.time() - stat.st_mtime > _QUIET_S:
            sealed = "" if _writer_alive(path, stat.st_mtime) else "gone"
        elif not (sealed or full) and used < len(chunk) and st.offset + len(chunk) == stat.st_size:
            if time.time() - stat.st_mtime > _QUIET_S:
                gone = not _writer_alive(path, stat.st_mtime)
                used, end, sealed = _unfinished(chunk, used, st.offset, gone, label, out)
        if used:
            if rows:
                self._record_bytes = max(16.0, 0.8 * self._record_bytes + 0.2 * used / rows)
            self._pending[path] = FileState(end, base, sealed)
        elif sealed != st.sealed:
            self._pending[path] = FileState(st.offset, base, sealed)
        return rows, used

    def pending(self) -> dict:
        """Offsets after the last :meth:`read`, for files it advanced (JSON-ready)."""
        return {p: _state_json(s) for p, s in self._pending.items()}

    def commit(self, seq: int | None = None) -> None:
        """Take the offsets of the last :meth:`read` (with batch ``seq``, which holds
        them in its manifest) and make them durable (:meth:`save`). Raises OSError if the
        offsets file cannot be written: they are taken all the same (the next save
        writes them), :attr:`durable_seq` says how far the file got."""
        self.files.update(self._pending)
        self._pending = {}
        if seq is not None:
            self.seq = max(self.seq, seq)
        self.save()

    def save(self) -> None:
        """Write ``offsets.json`` (temp file, optional fsync, rename), then set
        :attr:`durable_seq`. Raises OSError (e.g. a full disk), leaving no temp file."""
        path = os.path.join(self.state_dir, OFFSETS)
        tmp = path + ".tmp"
        files = {p: _state_json(s) for p, s in self.files.items()}
        seq = self.seq
        try:
            with open(tmp, "w") as f:
                json.dump({"seq": seq, "files": files}, f)
                if self.fsync:
                    f.flush()
                    os.fsync(f.fileno())
            os.replace(tmp, path)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        self.durable_seq = seq


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


def _state_json(st: FileState) -> dict:
    """A file's state as stored in ``offsets.json`` and batch manifests."""
    out: dict[str, Any] = {"offset": st.offset, "base": st.base}
    if st.sealed:
        out["sealed"] = st.sealed
    return out


def _size(path: str) -> int:
    """Bytes in file ``path`` (0 if it is gone)."""
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def _unfinished(
    chunk: bytes, used: int, offset: int, gone: bool, label: str, out: Parsed
) -> tuple[int, int, str]:
    """``(used, end, sealed)`` after the unfinished frame at ``chunk[used:]`` of a segment
    unchanged for a while (``chunk``: its bytes from ``offset`` to its end). If a whole
    frame starts after it, its length field was damaged (it runs past the end): reading
    goes on at that frame. Else, if its writer is ``gone``, the writer died writing it and
    the segment ends there; if not, it may still finish it: wait."""
    later = _next_frame(chunk, used + 1)
    start = offset + used
    if later is not None:
        out.rejected.append(
            f"{label}: damaged frame at byte {start} (its length runs past the end), "
            f"{later - used} bytes skipped"
        )
        return later, offset + later, ""
    if not gone:
        return used, start, ""
    lost = len(chunk) - used
    out.rejected.append(f"{label}: truncated frame at byte {start} ({lost} bytes), writer gone")
    return len(chunk), offset + len(chunk), "gone"


def _next_frame(chunk: bytes, at: int) -> int | None:
    """Where the first whole, checksummed frame at or after ``at`` starts (None if none)."""
    while (at := chunk.find(sf.MAGIC, at)) >= 0:
        if isinstance(next(sf.frames(chunk[at:]), None), sf.Frame):
            return at
        at += 1
    return None


def _first_frame_bytes(chunk: bytes) -> int:
    """Bytes of the frame ``chunk`` starts with (0 if it does not start with a frame)."""
    magic, kind, name_len, _, length, _, _ = sf.FRAME.unpack_from(chunk, 0)
    if magic != sf.MAGIC or length > sf.MAX_PAYLOAD:
        return 0
    return sf.FRAME_BYTES + ((name_len + 7) & ~7) + ((length + 7) & ~7)


def _writer_alive(path: str, mtime: float) -> bool:
    """Whether the process that writes spool file ``path`` (its pid is in the name) runs
    and started before the file was last written (a reused pid belongs to a younger one)."""
    from ranksight.collectors.local_ranks import is_alive, parse_spool_path

    found = parse_spool_path(path)
    return found is not None and is_alive(found.pid, mtime)
