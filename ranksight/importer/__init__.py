"""``ranksight import``: what a job that was never hooked left behind (Flight Recorder
dumps, Kineto traces, watchdog and NCCL debug logs, py-spy dumps, What-if Analysis
traces) turned into a run in the store, for the analyzer, the report and the UI."""

from .run import FileResult, ImportConfig, ImportResult, import_paths
from .sources import Artifact, find, sniff

__all__ = [
    "Artifact",
    "FileResult",
    "ImportConfig",
    "ImportResult",
    "find",
    "import_paths",
    "sniff",
]
