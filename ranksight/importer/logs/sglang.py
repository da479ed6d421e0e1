"""SGLang's log prefix: ``[2025-02-07 01:19:47 TP7] Load weight end. ...``.

SGLang's Python logger puts the time and the process's parallel ranks in brackets: ``TP7``
(tensor-parallel rank 7), with ``DP1``, ``PP0``, ``EP3`` beside it where the job has those
axes. Each rank so labelled is a ``present`` event (one per rank and file, ``count`` its
lines; ``pg`` ``tp``, ``group_rank`` the TP rank): a rank that logged "Load weight end"
is not one that left no line. ``TPn`` is the tensor-parallel rank; it is the global rank
only where the job is TP-only, so ``rank`` is set to it only where no line of the file
has a DP, PP, CP or EP label, and ``detail.assumed`` says that it was taken so.
"""

from __future__ import annotations

import re

from .events import Event
from .lines import LogLine

_LABELS = re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?P<labels>(?: (?:DP|TP|PP|EP|CP)\d+)+)\]")
MARKERS = ("TP",)
ASSUMED = ("sglang's [... TPn] label is taken as the global rank: it is the tensor-parallel "
           "rank, the global one only where the job is TP-only (no DP, PP, CP or EP label here)")  # fmt: skip


class Reader:
    """TP ranks of one file's SGLang lines."""

    name = "sglang"
    markers = MARKERS

    def __init__(self) -> None:
        self.lines: dict[int, int] = {}
        self.first: dict[int, int] = {}
        self.tp_only = True

    def feed(self, line: LogLine) -> None:
        """Count the line's TP rank; note any other parallel axis."""
        m = _LABELS.match(line.text)
        if not m:
            return
        labels = dict(re.findall(r"([A-Z]{2})(\d+)", m.group("labels")))
        if set(labels) - {"TP"}:
            self.tp_only = False
        if "TP" in labels:
            tp = int(labels["TP"])
            self.lines[tp] = self.lines.get(tp, 0) + 1
            self.first.setdefault(tp, line.number)

    def finish(self) -> list[Event]:
        """One ``present`` event per TP rank (global only in a TP-only file)."""
        detail = {"source": "sglang", **({"assumed": ASSUMED} if self.tp_only else {})}
        return [Event("present", rank=tp if self.tp_only else -1, group_rank=tp, pg="tp",
                      count=n, line=self.first[tp], detail=dict(detail))
                for tp, n in sorted(self.lines.items())]  # fmt: skip
