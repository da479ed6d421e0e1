"""Decode one read of a binary spool segment (``trainer_hooks/spool_format.py``) into
:class:`~.parse.Parsed`, each frame on its own.

Frames of one table with the same columns are joined into one Arrow array per column
and checked at once (``parse.check_columns``); a damaged frame is rejected (counted by
the rows it claims, at most one per 8 bytes: ``poison.damaged_rows``) and reading goes on
at the next frame. A frame whose checksum holds but that would break decoding is
quarantined (``agent/poison.py``): a row count its payload cannot hold, a header nested
too deep, or any exception its decoding or checks raise, foreseen or not. Then the
frames read with it are decoded again one by one, so it costs its own records only. A
segment with no usable header frame (damaged, nested, an identity its columns cannot
hold) takes its identity (run_id, attempt, rank) from its path.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from ranksight.store import schema
from ranksight.trainer_hooks import spool_format as sf

from .parse import HEADER_TABLE, Parsed, check_columns, parse_chunk
from .poison import Poison, Poisoned, damaged_rows, loads_bounded, plausible_rows
from .records import coerce

_BASE = ("run_id", "attempt", "rank")
_ARROW = {"i": pa.int64(), "u": pa.uint64(), "f": pa.float64()}
_CHECK_ERRORS = (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError)


@dataclass
class SegmentRead:
    """Where one read of a segment got: its header identity (``base``), ``sealed``
    (``"end"`` once its end frame was read), records and frames counted (``rows``), bytes
    of complete frames taken (``used``), and whether it stopped at the row limit."""

    base: dict | None
    chunk: bytes = b""
    offset: int = 0
    sealed: str = ""
    rows: int = 0
    used: int = 0
    full: bool = False
    groups: dict = field(default_factory=dict)

    def poison(self, item: sf.Frame, reason: str) -> Poison:
        """Frame ``item`` of this read, its bytes whole, as a Poison (counted by its own
        row count where plausible, else as 1)."""
        records = item.rows if 0 < item.rows <= plausible_rows(item) else 1
        raw = self.chunk[item.start - self.offset : item.end - self.offset]
        return Poison(reason, raw, item.start, records)


def decode(chunk: bytes, offset: int, base: dict | None, max_rows: int, path: str,
           out: Parsed) -> SegmentRead:  # fmt: skip
    """Decode the complete frames of ``chunk`` (segment ``path``'s bytes from ``offset``, a
    frame boundary; ``base``: its header identity if known) into ``out``, stopping once
    ``max_rows`` records are counted. Never raises for anything in ``chunk``."""
    state = SegmentRead(base, chunk, offset)
    label = os.path.basename(path)
    for item in sf.frames(chunk, offset):
        if state.rows >= max_rows:
            state.full = True
            break
        state.used = item.end - offset
        if isinstance(item, sf.Damage):
            n = damaged_rows(item)
            reason = f"{label}: damaged frame at byte {item.start} ({item.reason}), "
            out.rejected.extend([reason + f"{item.end - item.start} bytes skipped"] * n)
            state.rows += n
            continue
        local = Parsed()
        try:
            _frame(item, state, path, local)
        except Exception as exc:  # noqa: BLE001 - one frame never stops the segment
            reason = f"{label}: {type(exc).__name__} decoding it ({exc!s:.80})"
            local = Parsed(quarantined=[state.poison(item, reason)])
        out.extend(local)
    for (name, _), parts in state.groups.items():
        _check_group(name, parts, state, label, out)
    return state


def _frame(item: sf.Frame, state: SegmentRead, path: str, out: Parsed) -> None:
    """Take one checksummed frame into ``state`` and ``out`` (a COLUMNS frame into
    ``state.groups``, checked with the others of its table later)."""
    label = os.path.basename(path)
    bound = plausible_rows(item)
    state.rows += max(min(item.rows, bound), 1)
    if item.rows > bound:
        why = f"{item.rows} rows claimed, {len(item.payload)} payload bytes hold at most {bound}"
        out.quarantined.append(state.poison(item, f"{label}: {why}"))
    elif item.kind == sf.HEADER:
        state.base = _header(item, state, path, out) or state.base or identity_of(path)
    elif item.kind == sf.END:
        state.sealed = "end"
    elif (state.base or _path_identity(state, path)) is None:
        out.rejected.extend([f"{label}: record before header"] * item.rows)
    elif item.kind == sf.JSON_LINES:
        parsed = parse_chunk(bytes(item.payload), state.base, path)
        at = item.end - _pad(len(item.payload))  # where the payload starts
        parsed.quarantined = [p.moved(at) for p in parsed.quarantined]
        out.extend(parsed)
    else:
        columns = _frame_columns(item, label, out)
        if columns is not None:
            key = (item.name, tuple((c[0], c[1]) for c in columns))
            state.groups.setdefault(key, []).append((item, columns))


def _path_identity(state: SegmentRead, path: str) -> dict | None:
    """A segment with no usable header frame before its records takes its path's identity."""
    state.base = identity_of(path)
    return state.base


def identity_of(path: str) -> dict | None:
    """run_id, attempt and rank from a spool path (``<run_id>/a<attempt>/rank<r>-...``)."""
    from ranksight.collectors.local_ranks import parse_spool_path

    found = parse_spool_path(path)
    if found is None:
        return None
    return {"run_id": found.run_id, "attempt": found.attempt, "rank": found.rank}


def _header(item: sf.Frame, state: SegmentRead, path: str, out: Parsed) -> dict | None:
    """run_id, attempt and rank of a header frame (None, and a rejection or quarantine,
    if unusable)."""
    label = os.path.basename(path)
    try:
        header = loads_bounded(bytes(item.payload))
        if not isinstance(header, dict):
            raise ValueError("not a JSON object")
        ranks = schema.table("ranks")  # each value as its column takes it
        return {k: coerce(header[k], ranks.type_of(k)) for k in _BASE if k in header}
    except Poisoned as e:
        out.quarantined.append(state.poison(item, f"{label}: {HEADER_TABLE} frame {e}"))
    except (ValueError, TypeError, AttributeError) as e:
        out.rejected.append(f"{label}: unusable {HEADER_TABLE} frame ({str(e)[:80]})")
    return None


def _check_group(name: str, parts: list, state: SegmentRead, label: str, out: Parsed) -> None:
    """Check the frames ``parts`` of table ``name`` together into ``out``; if that raises
    anything unforeseen, each frame alone, quarantining those that still raise."""
    base, local = state.base or {}, Parsed()
    try:
        _check_parts(name, parts, base, label, local)
    except Exception:  # noqa: BLE001 - find the frame(s) at fault, keep the others
        local = Parsed()
        for part in parts:
            alone = Parsed()
            try:
                _check_parts(name, [part], base, label, alone)
            except Exception as exc:  # noqa: BLE001
                reason = f"{label}: {type(exc).__name__} checking it ({exc!s:.80})"
                alone = Parsed(quarantined=[state.poison(part[0], reason)])
            local.extend(alone)
    out.extend(local)


def _check_parts(name: str, parts: list, base: dict, label: str, out: Parsed) -> None:
    rows_table = _group_table(parts, label, out)
    if rows_table is None:
        return
    try:
        check_columns(name, rows_table, base, out)
    except _CHECK_ERRORS as e:
        out.rejected.extend([f"{label}: {name}: {str(e)[:80]}"] * rows_table.num_rows)


def _frame_columns(frame: sf.Frame, label: str, out: Parsed) -> list | None:
    """A ``COLUMNS`` frame's decoded column blocks (``spool_format.decode_columns``), or
    None, and a rejection of its records, if they are inconsistent."""
    try:
        columns = sf.decode_columns(frame.payload, frame.rows, aligned=False)
    except ValueError as e:
        _reject_frame(frame, label, e, out)
        return None
    if frame.rows and not columns:
        _reject_frame(frame, label, ValueError(f"no columns for {frame.rows} rows"), out)
        return None
    return columns


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
    except (ValueError, pa.ArrowInvalid, UnicodeDecodeError) as e:
        if len(parts) == 1:
            _reject_frame(parts[0][0], label, e, out)
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


def _concat_strings(
    blocks: list[tuple[np.ndarray, memoryview]],
) -> tuple[np.ndarray, bytes | memoryview]:
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


def _pad(n: int) -> int:
    """``n`` rounded up to a multiple of 8 (frames are 8-aligned)."""
    return (n + 7) & ~7
