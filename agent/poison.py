"""Spool input that breaks decoding ("poison"), found before it can: bounded JSON, and
row counts a frame's payload can actually hold.

A spool record or frame that would raise RecursionError or MemoryError in the decoder, or
that claims more records than its bytes can hold, is not a malformed record to reject but
a hazard to the agent itself: it becomes a :class:`Poison`, which the tailer moves aside
(``agent/quarantine.py``) and the agent counts, so that it costs its own bytes only.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import numpy as np

from ranksight.trainer_hooks import spool_format as sf

MAX_NESTING = 32
"""Deepest ``[``/``{`` nesting a spool line or frame payload may have. A record is one flat
object (depth 1): anything nested is rejected by the checks anyway, but past a few hundred
levels ``json.loads`` raises RecursionError instead of returning."""
_QUOTE, _BACKSLASH = ord('"'), ord("\\")
_OPEN, _CLOSE = (ord("["), ord("{")), (ord("]"), ord("}"))
_MARKS = np.array([_QUOTE, _BACKSLASH, *_OPEN, *_CLOSE], dtype=np.uint8)


class Poisoned(ValueError):
    """Input that would break the decoder (too deep, too big); the message says why."""


@dataclasses.dataclass(frozen=True, slots=True)
class Poison:
    """Bytes of a spool file set aside: ``data`` (a line, or a whole frame), where they
    start (``offset``, bytes into ``source``), why, and how many records they held (1
    where their own count cannot be trusted). ``kept``: the quarantine file holding them
    ("" until written; ``agent/quarantine.py``); ``new``: first time seen there."""

    reason: str
    data: bytes
    offset: int
    records: int = 1
    source: str = ""
    kept: str = ""
    new: bool = True

    def moved(self, by: int, source: str | None = None) -> Poison:
        """The same poison ``by`` bytes further into its file (a frame's payload inside
        its segment, a chunk inside its file), optionally naming ``source``."""
        return dataclasses.replace(
            self, offset=self.offset + by, source=self.source if source is None else source
        )


def too_deep(raw: bytes, limit: int = MAX_NESTING) -> bool:
    """Whether JSON text ``raw`` nests arrays/objects more than ``limit`` deep (brackets
    inside strings do not count). Costs one ``bytes.count`` pair unless ``raw`` holds more
    than ``limit`` opening brackets at all."""
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return False
    codes = np.frombuffer(raw, dtype=np.uint8)
    where = np.flatnonzero(np.isin(codes, _MARKS))
    depth, in_string, skip = 0, False, -1
    for at, code in zip(where.tolist(), codes[where].tolist(), strict=True):
        if at == skip:
            continue
        if in_string:
            if code == _BACKSLASH:
                skip = at + 1
            elif code == _QUOTE:
                in_string = False
        elif code == _QUOTE:
            in_string = True
        elif code in _OPEN:
            depth += 1
            if depth > limit:
                return True
        elif code in _CLOSE:
            depth -= 1
    return False


def loads_bounded(raw: bytes) -> Any:
    """``json.loads(raw)``, refusing what would break it. Raises Poisoned (nested over
    :data:`MAX_NESTING`, or RecursionError / MemoryError while decoding), ValueError for
    text that is not JSON."""
    if too_deep(raw):
        raise Poisoned(f"nested over {MAX_NESTING} deep")
    try:
        return json.loads(raw)
    except (RecursionError, MemoryError) as exc:
        raise Poisoned(f"{type(exc).__name__} decoding {len(raw)} bytes") from None


def plausible_rows(frame: sf.Frame) -> int:
    """The most records ``frame``'s payload can hold: a ``COLUMNS`` record takes at least 4
    bytes (a string offset; a number takes 8), a ``JSON_LINES`` record a line. Header and
    end frames hold none (their count is not checked: any)."""
    if frame.kind == sf.COLUMNS:
        return len(frame.payload) // 4
    if frame.kind == sf.JSON_LINES:
        return bytes(frame.payload).count(b"\n") + 1
    return frame.rows


def damaged_rows(damage: sf.Damage) -> int:
    """Records to count for a damaged stretch: the row count its header claims (not
    trusted: a flipped bit may make it 2^32), at most one per 8 bytes of the stretch."""
    return min(max(damage.rows, 1), max(1, (damage.end - damage.start) // 8))
