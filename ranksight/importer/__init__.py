"""``ranksight import``: what a job that was never hooked left behind (text logs of
every kind a job prints, Flight Recorder dumps, Kineto traces, py-spy dumps, What-if
Analysis traces) turned into a run in the store, for the analyzer, the report and the
UI. Formats are registered in :mod:`.formats`, line formats of text logs in :mod:`.logs`
(docs/import-formats.md)."""

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
