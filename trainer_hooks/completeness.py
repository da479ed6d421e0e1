"""An independent count of collectives, to prove the hooks miss none.

:class:`DispatchCounter` is a TorchDispatchMode that counts every c10d op and functional
collective by group at the dispatcher, below every Python entry point (``dist.*``,
DTensor, FSDP2, pipelining, DDP's C++ reducer). With ``RANKSIGHT_VERIFY_COUNTS=1`` the
hooks run it beside their own recording and, at close, write both counts per group to
``<spool_dir>/<run_id>/a<attempt>/counts-rank<r>.json``: ``{"hooks": {group: n},
"dispatch": {group: n}}``. It costs a Python call per tensor op: a check, not a level.
"""

from __future__ import annotations

import collections
import json
import os
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .collectives import _C10D_OPS, _FUNCTIONAL_OPS, _PG_TYPE
from .groups import GroupRegistry

_C = torch._C._distributed_c10d


class DispatchCounter(TorchDispatchMode):
    """Counts collective ops per group id (``counts``); P2P ops count under their group."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: collections.Counter[str] = collections.Counter()
        self.ops: collections.Counter[str] = collections.Counter()
        """Counts per ``"<group_id> <namespace>.<op>"``, to see what a gap is made of."""
        self._groups = GroupRegistry()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        try:
            gid = self._group_of(func, args, kwargs)
            if gid is not None:
                self.counts[gid] += 1
                self.ops[f"{gid} {func.namespace}.{func._opname}"] += 1
        except Exception:  # counting must never break training
            self.counts["<unresolved>"] += 1
        return func(*args, **kwargs)

    def _group_of(self, func, args, kwargs) -> str | None:
        ns, name = func.namespace, func._opname
        if ns == "c10d" and name in _C10D_OPS:
            pg = next(
                a
                for a in args
                if isinstance(a, torch.ScriptObject) and a._type().qualified_name() == _PG_TYPE
            )
            return self._groups.by_group(_C.ProcessGroup.unbox(pg)).group_id
        if ns == "_c10d_functional" and name in _FUNCTIONAL_OPS:
            values = list(args) + list(kwargs.values())
            return self._groups.by_name(
                next(a for a in reversed(values) if isinstance(a, str))
            ).group_id
        return None


def hook_counts(records: list[dict[str, Any]]) -> dict[str, int]:
    """Collective records per group id."""
    return dict(collections.Counter(r["group_id"] for r in records))


def write_counts(
    path: str, hooks: dict[str, int], hooks_ops: dict[str, int], counter: DispatchCounter
) -> None:
    """Write both counts, per group and per ``"<group> <op>"``, as JSON to ``path``."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    doc = {"hooks": hooks, "hooks_ops": hooks_ops, "dispatch": dict(counter.counts),
           "dispatch_ops": dict(counter.ops)}  # fmt: skip
    with open(path, "w") as f:
        json.dump(doc, f, sort_keys=True)
