"""Cross-rank diagnosis: pure functions over tables; SQL pushed down to the store."""

from .api import analyze, save_findings
from .diagnose import Analysis, diagnose
from .findings import Finding
from .queries import RunData, UnknownRun, list_runs, load_run
from .straggler import StragglerConfig

__all__ = [
    "Analysis",
    "Finding",
    "RunData",
    "StragglerConfig",
    "UnknownRun",
    "analyze",
    "diagnose",
    "list_runs",
    "load_run",
    "save_findings",
]
