"""Counts in messages: ``1 step``, ``2 steps``, never ``1 steps``."""

from __future__ import annotations


def counted(n: int, noun: str, plural: str | None = None, spec: str = "") -> str:
    """``n`` and ``noun``, in the plural unless ``n`` is 1: ``counted(1, "step")`` is
    ``"1 step"``, ``counted(3, "entry", "entries")`` is ``"3 entries"`` (``plural``
    defaults to ``noun + "s"``). ``spec`` formats ``n``: ``","`` gives ``1,024 rows``."""
    return f"{n:{spec}} {noun if n == 1 else plural or noun + 's'}"


def span(ranks, limit: int = 16) -> str:
    """Ranks as a person writes them: ``[0, 1, 2, 3, 5, 7]`` -> ``"0-3,5,7"``; more than
    ``limit`` runs end with ``,... (N ranks)``. Duplicates are folded; order is sorted."""
    rs = sorted({int(r) for r in ranks})
    runs: list[str] = []
    i = 0
    while i < len(rs):
        j = i
        while j + 1 < len(rs) and rs[j + 1] == rs[j] + 1:
            j += 1
        runs.append(
            str(rs[i]) if i == j else f"{rs[i]}-{rs[j]}" if j > i + 1 else f"{rs[i]},{rs[j]}"
        )
        i = j + 1
    text = ",".join(runs[:limit])
    return text + (f",... ({len(rs)} ranks)" if len(runs) > limit else "")
