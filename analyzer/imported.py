"""What a run's ``meta_json`` says of runs made by ``ranksight import`` (``"source":
"import"``, and the ranks whose artifact was damaged). Imported runs get snapshot-based
hang findings (``detectors/postmortem.py``) instead of the live stall test, and what-if
replay impacts for stragglers (``whatif/impact.py: replay_impacts``)."""

from __future__ import annotations

import json


def is_imported(run: dict) -> bool:
    """True for a run written by ``ranksight import``."""
    try:
        meta = json.loads(run.get("meta_json") or "{}")
    except (TypeError, ValueError):
        return False
    return isinstance(meta, dict) and meta.get("source") == "import"


def partial_ranks(run: dict) -> dict[int, str]:
    """rank -> why its artifact tells nothing of its progress (the import's
    ``partial_ranks``: a damaged Flight Recorder dump), from the run's ``meta_json``."""
    try:
        meta = json.loads(run.get("meta_json") or "{}")
        return {int(r): str(why) for r, why in (meta.get("partial_ranks") or {}).items()}
    except (TypeError, ValueError, AttributeError):
        return {}
