"""Counts in messages: ``1 step``, ``2 steps``, never ``1 steps``."""

from __future__ import annotations


def counted(n: int, noun: str, plural: str | None = None, spec: str = "") -> str:
    """``n`` and ``noun``, in the plural unless ``n`` is 1: ``counted(1, "step")`` is
    ``"1 step"``, ``counted(3, "entry", "entries")`` is ``"3 entries"`` (``plural``
    defaults to ``noun + "s"``). ``spec`` formats ``n``: ``","`` gives ``1,024 rows``."""
    return f"{n:{spec}} {noun if n == 1 else plural or noun + 's'}"
