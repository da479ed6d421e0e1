"""Read the records ranks leave in the node's spool, each exactly once across restarts.

The hooks write binary segments ``<spool>/<run_id>/a<attempt>/rank<r>-<pid>-<n>.spool``
(``trainer_hooks/spool_format.py``): a header frame (run_id, attempt, rank), frames of
columnar records, and an end frame once the writer moved on. The tailer reads complete
frames only, past each file's offset, and hands their columns to
``agent/parse.check_columns``; a damaged frame is rejected (logged, counted) and reading
goes on at the next frame. An incomplete frame at the end of a segment whose writer is
gone is rejected as truncated. A segment read to its end frame (or whose writer is gone)
is *sealed*: nothing more will come, and the agent may delete it once the store has it.

JSON spool files ``rank<r>-<pid>.jsonl`` (older hooks, hand-written producers) are still
read: a header line, then one record a line; complete lines only. The offsets of
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
import sys
import time
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from ranksight.trainer_hooks import spool_format as sf

from .parse import HEADER_TABLE, Parsed, check_columns, parse_chunk

OFFSETS = "offsets.json"
MAX_LINE = 8 << 20
"""Longest spool line read, bytes (a record with strings at ``records.MAX_STRING``)."""


def state_dir_for(spool_dir: str, key: str) -> str:
    """The agent's folder for destination ``key`` (a store URL): ``<spool>/.agent-<hash>``."""
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
    _record_bytes: float = 256.0  # the same for binary segments

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
            sealed = st.get("sealed") or ""
            self.files[path] = FileState(int(st["offset"]), st.get("base"), str(sealed))

    def paths(self) -> list[str]:
        """Spool files present now (binary segments and JSON files), sorted."""
        pattern = os.path.join(self.spool_dir, "*", "a*", "*")
        return sorted(p for p in glob.glob(pattern) if p.endswith((sf.SUFFIX, ".jsonl")))

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
            if st.sealed == "end" or (st.sealed == "gone" and _size(path) <= st.offset):
                continue
            read = self._read_segment if path.endswith(sf.SUFFIX) else self._read_file
            n_lines, n_bytes = read(path, st, lines_left, max_bytes, out)
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
        base, sealed, rows, used, full = st.base, "", 0, 0, False
        groups: dict[tuple, list[pa.Table]] = {}
        for item in sf.frames(chunk, st.offset):
            if rows >= max_rows:
                full = True
                break
            used = item.end - st.offset
            if isinstance(item, sf.Damage):
                n = max(item.rows, 1)
                reason = f"{label}: damaged frame at byte {item.start} ({item.reason}), "
                out.rejected.extend([reason + f"{item.end - item.start} bytes skipped"] * n)
                rows += n
                continue
            rows += max(item.rows, 1)
            if item.kind == sf.HEADER:
                base = _header(item.payload, label, out) or base
            elif item.kind == sf.END:
                sealed = "end"
            elif base is None:
                out.rejected.extend([f"{label}: record before header"] * item.rows)
            elif item.kind == sf.JSON_LINES:
                parsed = parse_chunk(bytes(item.payload), base, path)
                out.extend(parsed)
            else:
                columns = _frame_columns(item, label, out)
                if columns is not None:
                    key = (item.name, tuple((c[0], c[1]) for c in columns))
                    groups.setdefault(key, []).append((item, columns))
        for (name, _), parts in groups.items():
            rows_table = _group_table(parts, label, out)
            if rows_table is None:
                continue
            try:
                check_columns(name, rows_table, base, out)
            except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError) as e:
                out.rejected.extend([f"{label}: {name}: {str(e)[:80]}"] * rows_table.num_rows)
        end = st.offset + used
        if not sealed and end == stat.st_size and time.time() - stat.st_mtime > _QUIET_S:
            sealed = "" if _writer_alive(path, stat.st_mtime) else "gone"
        elif not (sealed or full) and used < len(chunk) and st.offset + len(chunk) == stat.st_size:
            if time.time() - stat.st_mtime > _QUIET_S and not _writer_alive(path, stat.st_mtime):
                lost = len(chunk) - used  # an incomplete frame its writer will never finish
                out.rejected.append(
                    f"{label}: truncated frame at byte {end} ({lost} bytes), writer gone"
                )
                used, end, sealed = len(chunk), stat.st_size, "gone"
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
        files = {p: _state_json(s) for p, s in self.files.items()}
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


def _state_json(st: FileState) -> dict:
    """A file's state as stored in ``offsets.json`` and batch manifests."""
    out = {"offset": st.offset, "base": st.base}
    if st.sealed:
        out["sealed"] = st.sealed
    return out


def _size(path: str) -> int:
    """Bytes in file ``path`` (0 if it is gone)."""
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def _first_frame_bytes(chunk: bytes) -> int:
    """Bytes of the frame ``chunk`` starts with (0 if it does not start with a frame)."""
    magic, kind, name_len, _, length, _, _ = sf.FRAME.unpack_from(chunk, 0)
    if magic != sf.MAGIC or length > sf.MAX_PAYLOAD:
        return 0
    return sf.FRAME_BYTES + ((name_len + 7) & ~7) + ((length + 7) & ~7)


def _header(payload: memoryview, label: str, out: Parsed) -> dict | None:
    """run_id, attempt and rank of a header frame (None, and a rejection, if unusable)."""
    try:
        header = json.loads(bytes(payload))
        base = {k: header[k] for k in _BASE if k in header}
        if not isinstance(base.get("run_id", ""), str) or not all(
            isinstance(base.get(k, 0), int) for k in ("attempt", "rank")
        ):
            raise ValueError(f"bad identity {base}")
        return base
    except (ValueError, TypeError, AttributeError) as e:
        out.rejected.append(f"{label}: unusable {HEADER_TABLE} frame ({str(e)[:80]})")
        return None


_ARROW = {"i": pa.int64(), "u": pa.uint64(), "f": pa.float64()}


def _frame_columns(frame: sf.Frame, label: str, out: Parsed) -> list | None:
    """A ``COLUMNS`` frame's decoded column blocks (``spool_format.decode_columns``), or
    None, and a rejection of its records, if they are inconsistent."""
    try:
        return sf.decode_columns(frame.payload, frame.rows, aligned=False)
    except ValueError as e:
        _reject_frame(frame, label, e, out)
        return None


def _reject_frame(frame: sf.Frame, label: str, error: Exception, out: Parsed) -> None:
    out.rejected.extend(
        [f"{label}: bad {frame.name} frame ({str(error)[:80]})"] * max(frame.rows, 1)
    )


def _group_table(parts: list[tuple[sf.Frame, list]], label: str, out: Parsed) -> pa.Table | None:
    """One Arrow table of the frames ``parts`` (same table, same columns and kinds), each
    column one contiguous array: the frames' blocks are concatenated (one memcpy) and
    checked once (string offsets in order, UTF-8), so the Arrow and compute calls after
    it cost per read, not per frame (a frame holds a few hundred to a few thousand
    records). If the check fails, each frame is checked alone and only those that fail it
    are rejected (None if none is left)."""
    try:
        return _concat_columns(parts)
    except (ValueError, pa.ArrowInvalid, UnicodeDecodeError):
        if len(parts) == 1:
            _reject_frame(parts[0][0], label, sys.exc_info()[1], out)
            return None
    good = []
    for part in parts:
        try:
            _concat_columns([part])
            good.append(part)
        except (ValueError, pa.ArrowInvalid, UnicodeDecodeError) as e:
            _reject_frame(part[0], label, e, out)
    return _concat_columns(good) if good else None


def _concat_columns(parts: list[tuple[sf.Frame, list]]) -> pa.Table:
    """:func:`_group_table`'s concatenation; raises ArrowInvalid for a bad string block."""
    rows = sum(frame.rows for frame, _ in parts)
    names, arrays = [], []
    for i, (name, kind, _, _) in enumerate(parts[0][1]):
        blocks = [columns[i] for _, columns in parts]
        if kind in _ARROW:
            values = np.concatenate([b[2] for b in blocks])  # aligned, as Arrow wants
            array = pa.Array.from_buffers(_ARROW[kind], rows, [None, pa.py_buffer(values)])
        else:
            offsets, data = _concat_strings([(b[2], b[3]) for b in blocks])
            arrow = pa.string() if offsets.dtype == np.int32 else pa.large_string()
            buffers = [None, pa.py_buffer(offsets), pa.py_buffer(data)]
            array = pa.Array.from_buffers(arrow, rows, buffers)
            array.validate(full=True)  # offsets in order, UTF-8
        names.append(name)
        arrays.append(array)
    return pa.Table.from_arrays(arrays, names=names)


def _concat_strings(blocks: list[tuple[np.ndarray, memoryview]]) -> tuple[np.ndarray, bytes]:
    """One string column's (offsets, bytes) from several frames' (offsets, bytes): int32
    offsets while the bytes fit them, else int64."""
    if len(blocks) == 1:
        offsets, data = blocks[0]
        return np.require(offsets, requirements="A"), data
    sizes = [len(data) for _, data in blocks]
    total = sum(sizes)
    shifts = np.cumsum([0, *sizes[:-1]], dtype=np.int64)
    starts = np.concatenate([o[:-1] for o, _ in blocks]).astype(np.int64)
    starts += np.repeat(shifts, [len(o) - 1 for o, _ in blocks])
    offsets = np.empty(len(starts) + 1, dtype=np.int32 if total < 1 << 31 else np.int64)
    offsets[:-1], offsets[-1] = starts, total
    return offsets, b"".join(data for _, data in blocks)


def _writer_alive(path: str, mtime: float) -> bool:
    """Whether the process that writes spool file ``path`` (its pid is in the name) runs
    and started before the file was last written (a reused pid belongs to a younger one)."""
    from ranksight.collectors.local_ranks import is_alive, parse_spool_path

    found = parse_spool_path(path)
    return found is not None and is_alive(found.pid, mtime)
