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

from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from ..run import ImportResult, ImportState


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
