"""Bad input the collectors met, counted and logged once per place (a file, a column), so
that a counter file holding garbage every second is one warning, not one a second."""

from __future__ import annotations

import logging
from collections import Counter

MAX_PLACES = 1000
"""Places remembered as told; past it, bad input is still counted but no longer logged
(a tree of a million garbage files must not grow the agent without end)."""


class Complaints:
    """Counts of bad input by place; the first of each place logged as a warning."""

    def __init__(self, log: logging.Logger) -> None:
        self.log = log
        self.counts: Counter[str] = Counter()
        """Bad inputs met, by place; the sum of all is :attr:`total`."""
        self.total = 0

    def note(self, place: str, why: str) -> None:
        """Count bad input at ``place``; the first at a place is logged as
        ``<place>: <why>``."""
        self.total += 1
        if place in self.counts or len(self.counts) < MAX_PLACES:
            first = place not in self.counts
            self.counts[place] += 1
            if first:
                self.log.warning("%s: %s", place, why)
