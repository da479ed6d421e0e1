"""Bad input the collectors met, counted and logged once per place (a file, a column), so
that a counter file holding garbage every second is one warning, not one a second."""

from __future__ import annotations

import logging
from collections import Counter

MAX_PLACES = 1000
"""Places remembered as told; past it the oldest is forgotten (and would be told again),
so that a tree of a million garbage files does not grow the agent without end."""


class Complaints:
    """Counts of bad input by place; the first of each place logged as a warning."""

    def __init__(self, log: logging.Logger) -> None:
        self.log = log
        self.counts: Counter[str] = Counter()
        """Bad inputs met, by place (the last :data:`MAX_PLACES` places)."""
        self.total = 0
        """Bad inputs met, all places."""

    def note(self, place: str, why: str) -> None:
        """Count bad input at ``place``; the first at a place is logged as
        ``<place>: <why>``."""
        self.total += 1
        if place not in self.counts:
            if len(self.counts) >= MAX_PLACES:
                del self.counts[next(iter(self.counts))]
            self.log.warning("%s: %s", place, why)
        self.counts[place] += 1
