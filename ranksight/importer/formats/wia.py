"""What-if Analysis traces (ByteDance-Seed/StragglerAnalysis's parquet, with its
``meta-*.yaml`` beside it): ops of every recorded worker (:mod:`ranksight.importer.wia`)."""

from __future__ import annotations

import re

from ranksight.ground.words import counted

from .. import wia
from .base import Format


class WhatIf(Format):
    """A What-if Analysis trace: the job's mesh comes with it."""

    kind = "wia_trace"

    @staticmethod
    def recognize(head: bytes, text: str) -> str | None:
        """Parquet (``PAR1``); its YAML run description is skipped (read with the trace)."""
        if head[:4] == b"PAR1":
            return ""
        if re.match(r"\s*(trial_name|dp_size|pp_size)\s*:", text) or (
            "dp_size:" in text and "pp_size:" in text
        ):
            return "What-if Analysis run description (read with its trace)"
        return None

    def read(self, path: str, rank: int | None) -> tuple[str, int | None]:
        """The whole trace (its uncompressed data at most half the memory budget). Raises
        ValueError if its columns are not What-if Analysis's or it passes that."""
        table, dropped = wia.load(path, self.state.cfg.memory_mb << 19)
        rows, mesh = wia.rows_of(table, wia.meta_beside(path))
        self.state.rows.merge(rows)
        self.state.mesh = mesh
        note = f"{counted(len(table), 'op')}, {counted(len(rows.tables.get('ranks', [])), 'rank')}"
        if dropped:
            note += f": left out {counted(dropped, 'op')} of no integer rank/step or finite time"
        return note, None
