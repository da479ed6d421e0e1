"""Decide that a rank stopped making progress, and take the stacks of its run's local ranks.

A hooked rank appends to its spool file at every step, phase and collective it issues. A
rank whose process is alive but whose file has not grown for ``stall_s`` seconds is
stuck — in a collective whose peers never came, in a data loader, in a deadlock. The
watcher then dumps every local rank of that run with py-spy at once (trigger
``no_progress``) — the stuck one and the ones waiting for it, so the odd stack out can be
seen — and does so once per stall: again only after the run has progressed in between.
"""

from __future__ import annotations

import os
import time

from ranksight.collectors.base import Collector, NodeContext, Rows
from ranksight.collectors.local_ranks import LocalRank, LocalRanks
from ranksight.collectors.pyspy import PySpyConfig, StackTaker


class StallWatcher(Collector):
    """Checks the local ranks' spool files every ``interval_s``; see the module doc."""

    name = "stacks"
    tables = ("stacks",)

    def __init__(
        self,
        ctx: NodeContext,
        *,
        stall_s: float = 60.0,
        interval_s: float = 5.0,
        pyspy: PySpyConfig | None = None,
        local_ranks: LocalRanks | None = None,
    ) -> None:
        if stall_s <= 0 or interval_s <= 0:
            raise ValueError(f"stall_s and interval_s must be > 0, got {stall_s}, {interval_s}")
        self.ctx = ctx
        self.stall_s = stall_s
        self.interval_s = interval_s
        self.pyspy = pyspy
        self.local_ranks = local_ranks or LocalRanks(ctx.spool_dir)
        self.taker: StackTaker | None = None
        self._size: dict[str, tuple[int, float]] = {}
        self._dumped: set[tuple[str, int]] = set()

    def open(self) -> None:
        """Find py-spy; raises Unavailable without it."""
        self.taker = StackTaker(self.ctx.host, self.pyspy)

    def stalled(self, ranks: list[LocalRank], now: float) -> set[tuple[str, int]]:
        """Runs ``(run_id, attempt)`` with a rank whose spool file has not grown for
        ``stall_s`` seconds (``now``: ``time.monotonic()``); updates what was seen."""
        stuck, seen = set(), set()
        for lr in ranks:
            seen.add(lr.spool_path)
            try:
                size = os.stat(lr.spool_path).st_size
            except OSError:
                continue
            last = self._size.get(lr.spool_path)
            if last is None or size != last[0]:
                self._size[lr.spool_path] = (size, now)
            elif now - last[1] >= self.stall_s:
                stuck.add((lr.run_id, lr.attempt))
        for path in set(self._size) - seen:
            del self._size[path]
        return stuck

    def collect(self, now_ns: int) -> Rows:
        """``stacks`` rows of every run that newly stalled."""
        ranks = self.local_ranks.get()
        stuck = self.stalled(ranks, time.monotonic())
        self._dumped &= stuck  # a run that moved again may be dumped at its next stall
        rows = []
        for run in sorted(stuck - self._dumped):
            self._dumped.add(run)
            mine = [lr for lr in ranks if (lr.run_id, lr.attempt) == run]
            rows.extend(self.taker.take(mine, "no_progress"))
        return {"stacks": rows}
