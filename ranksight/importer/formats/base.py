"""The one interface every import format has (registered in ``formats/__init__.py``).

A format is a class with:

- ``kind``: its name in messages and the run's ``kinds``;
- ``recognize(head, text)`` (static): from a file's first 64 KiB (decompressed) and
  their text, ``None`` (not this format), ``""`` (this format) or a reason to skip the
  file ("What-if Analysis run description: read with its trace");
- ``read(path, rank)``: read one file into the import's rows; returns ``(message,
  rank)`` (what was read, the rank the file turned out to be, or None); raises
  ValueError, OSError or EOFError naming what is wrong (the file is then listed as not
  imported, the others go on). A message starting ``skipped: `` lists the file as no
  artifact;
- ``finish(result)``: once every file is read, the rows that need all files (group
  members, merges, who was silent);
- ``mark()``, ``forget_last()``: before each ``read``, remember what is held outside
  ``state.rows``; drop back to it (a file refused during or after reading: a second
  file of one rank, a reader's error);
- ``one_per_rank``: a second file of one rank is refused (another job's file).
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from ..run import ImportResult, ImportState


_CUT_VALUE = re.compile(r"[-+.eE0-9]*|t(r(ue?)?)?|f(a(l(se?)?)?)?|n(u(ll?)?)?")
"""What a JSON value cut at the end of the prefix can leave after the decoder stops: part
of a number (``1.``, ``2e-``) or of a literal (``tr``)."""


def json_prefix(text: str) -> bool:
    """Whether ``text`` (a file's first 64 KiB, decoded) begins a JSON object: its first
    value parses, or the text ends inside it (a document longer than the prefix). Text
    that merely opens with ``{``, as a Python dict's repr does (HF Trainer's metrics
    lines ``{'loss': 0.1146, ...}``: keys in single quotes), is none."""
    s = text.lstrip()
    if not s.startswith("{"):
        return False
    try:
        json.JSONDecoder().raw_decode(s)
    except json.JSONDecodeError as exc:
        return exc.msg.startswith("Unterminated string") or bool(
            _CUT_VALUE.fullmatch(s[exc.pos :].strip())
        )
    return True


class Format:
    """Base of every import format (see the module doc); ``state`` is the import's."""

    kind: ClassVar[str] = ""
    one_per_rank: ClassVar[bool] = False

    def __init__(self, state: ImportState) -> None:
        self.state = state

    @staticmethod
    def recognize(head: bytes, text: str) -> str | None:
        """None: not this format; "": this format; else why the file is skipped."""
        return None

    def read(self, path: str, rank: int | None) -> tuple[str, int | None]:
        """Read one file (see the module doc)."""
        raise NotImplementedError

    def finish(self, result: ImportResult) -> None:
        """Rows that need every file of this format."""

    def mark(self) -> None:
        """Remember what is held outside ``state.rows`` before a :meth:`read`."""

    def forget_last(self) -> None:
        """Drop what the last :meth:`read` held outside ``state.rows`` (back to :meth:`mark`)."""
