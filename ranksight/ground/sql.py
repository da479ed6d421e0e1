"""SQL words every layer shares."""

from __future__ import annotations

RUN = "run_id = %(run_id)s AND attempt = %(attempt)s"
"""The per-run predicate of every query of one run attempt (bound parameters ``run_id``
(String) and ``attempt`` (UInt32)): its one home, for the analyzer's and the UI's SQL."""
