"""py-spy dumps (``py-spy dump`` text or ``--json``): one process's threads -> a
``stacks`` row (rank from the file name) and a ``stack`` log event (with or without a
rank: one rank's view is evidence too; :mod:`ranksight.importer.pyspy`)."""

from __future__ import annotations

import re

from ranksight.collectors.bounded import read_bytes
from ranksight.ground.words import counted

from .base import Format

_FIRST = re.compile(r"(?:Process \d+:|Thread (?:0x[0-9A-Fa-f]+|\d+) \((?:idle|active))")


class PySpy(Format):
    """py-spy dumps."""

    kind = "pyspy"

    @staticmethod
    def recognize(head: bytes, text: str) -> str | None:
        """A file that begins as a dump (``Process N:`` or ``Thread N (idle|active...)``
        first), or py-spy's JSON list of threads. A log with dumps pasted among other
        lines is a text log (its dumps are read by ``logs/pystacks.py``)."""
        s = text.lstrip()
        if s.startswith("[") and '"thread_name"' in text and '"frames"' in text:
            return ""
        return "" if _FIRST.match(s) else None

    def read(self, path: str, rank: int | None) -> tuple[str, int | None]:
        """One dump (gzip or not, at most ``file_bytes`` of it). Raises ValueError if it has
        no thread or passes the limit."""
        from .. import pyspy  # on use: an import of dumps alone need not load the log readers

        st = self.state
        data, damage = read_bytes(path, st.cfg.file_bytes, st.cfg.limit_why)
        if damage:
            raise ValueError(damage)
        text = data.decode("utf-8", errors="replace")
        pid, threads = (
            pyspy.parse_json(text)
            if text.lstrip().startswith(("[", "{"))
            else pyspy.parse_text(text)
        )
        st.log_events.append(pyspy.event_of(rank, pid, threads, st.shown))
        if rank is None:
            return counted(len(threads), "thread") + ": no rank in the file name", None
        st.rows.add("stacks", pyspy.row_of(rank, pid, threads, st.cfg.host, st.ts_ns))
        st.rows.add("ranks", {"rank": rank, "pid": pid, "dp": -1, "tp": -1, "pp": -1})
        return counted(len(threads), "thread"), rank
