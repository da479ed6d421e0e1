"""Process-group identity that is the same on every member rank.

A group is named by its member ranks and its creation order among groups with the same
members, like the Flight Recorder's pg hash: ``g<10 hex of sha1(ranks)>`` plus ``.k`` for
the k-th (k >= 1) group created over the same ranks.
"""

from __future__ import annotations

import hashlib
import weakref
from dataclasses import dataclass

import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d


@dataclass(frozen=True, slots=True)
class GroupInfo:
    """One process group as seen by this rank: stable id, member global ranks, and this
    rank's index in it."""

    group_id: str
    ranks: tuple[int, ...]
    ranks_str: str = ""
    """Member ranks as ``"0,2,4,6"`` (built once: every record of the group carries it)."""

    def __post_init__(self) -> None:
        if not self.ranks_str:
            object.__setattr__(self, "ranks_str", ",".join(map(str, self.ranks)))

    def global_rank(self, group_rank: int) -> int:
        """Global rank of member ``group_rank``; -1 if out of range."""
        return self.ranks[group_rank] if 0 <= group_rank < len(self.ranks) else -1


def _group_id(ranks: tuple[int, ...], ordinal: int) -> str:
    digest = hashlib.sha1(",".join(map(str, ranks)).encode()).hexdigest()[:10]
    return f"g{digest}" if ordinal == 0 else f"g{digest}.{ordinal}"


class GroupRegistry:
    """Resolves a ProcessGroup (or functional-collective group name) to a GroupInfo,
    cached by group name. Groups created after attach are resolved on first use."""

    def __init__(self) -> None:
        self._by_name: dict[str, GroupInfo] = {}
        self._by_pg: dict[int, tuple[weakref.ref, GroupInfo]] = {}

    def _rebuild(self) -> None:
        seen: dict[tuple[int, ...], int] = {}
        for pg, rank_map in c10d._world.pg_group_ranks.items():  # insertion = creation order
            if not hasattr(pg, "group_name"):  # non-member placeholders
                continue
            ranks = tuple(sorted(rank_map))
            ordinal = seen.get(ranks, 0)
            seen[ranks] = ordinal + 1
            self._by_name[pg.group_name] = GroupInfo(_group_id(ranks, ordinal), ranks)

    def by_name(self, group_name: str) -> GroupInfo:
        """GroupInfo for a c10d group name; raises KeyError if no such group exists here."""
        info = self._by_name.get(group_name)
        if info is None:
            self._rebuild()
            info = self._by_name[group_name]
        return info

    def by_group(self, pg: dist.ProcessGroup | None) -> GroupInfo:
        """GroupInfo for a ProcessGroup object (None: the default group). Cached by the
        object through a weak reference: the registry never keeps a group alive, so
        ``destroy_process_group`` frees it (and its backend's threads) while the process
        runs, not in the interpreter's teardown, where a gloo group still alive could abort
        the process ("terminate called without an active exception"). An id reused by a
        later object misses, as its weak reference no longer points to it."""
        if pg is None:
            pg = c10d._world.default_pg or c10d._get_default_group()  # raises if none
        hit = self._by_pg.get(id(pg))
        if hit is not None and hit[0]() is pg:
            return hit[1]
        info = self.by_name(pg.group_name)
        self._by_pg[id(pg)] = (weakref.ref(pg), info)
        return info
