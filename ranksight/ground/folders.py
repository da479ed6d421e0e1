"""Whether a path given as a folder (``--spool``, ``--buffer-dir``, a chdb ``--store``)
can be one, checked before anything is opened so that the error names the path and the
problem instead of an ``[Errno 20] Not a directory`` from deep inside."""

from __future__ import annotations

import os


def folder_problem(path: str) -> str:
    """What keeps ``path`` from being used as a folder that is there or can be made, or
    ``""``: ``"is a file, not a folder"``, or ``"cannot be made: F is a file, not a
    folder"`` when a file ``F`` stands where a folder above it would be."""
    p = os.path.abspath(os.path.expanduser(path))
    if os.path.isdir(p):
        return ""
    if os.path.exists(p):
        return "is a file, not a folder"
    up = os.path.dirname(p)
    while not os.path.exists(up):  # the root always exists
        up = os.path.dirname(up)
    return "" if os.path.isdir(up) else f"cannot be made: {up} is a file, not a folder"
