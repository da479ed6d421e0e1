"""``ranksight import``: what a job that was never hooked left behind (text logs of
every kind a job prints, Flight Recorder dumps, Kineto traces, py-spy dumps, What-if
Analysis traces) turned into a run in the store, for the analyzer, the report and the
UI. Formats are registered in :mod:`.formats`, line formats of text logs in :mod:`.logs`
(docs/import-formats.md).

The names below load on first use (PEP 562), so ``from ranksight.importer.summary import
ARTIFACTS`` (the CLI's help text) imports no reader, store or numpy."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
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

_HOME = {"Artifact": ".sources", "find": ".sources", "sniff": ".sources"}


def __getattr__(name: str) -> object:
    """A name of :data:`__all__` from its module (``.run`` or ``.sources``), imported on
    first use. Raises AttributeError for any other name."""
    if name not in __all__:
        raise AttributeError(f"module 'ranksight.importer' has no attribute {name!r}")
    return getattr(importlib.import_module(_HOME.get(name, ".run"), __name__), name)
