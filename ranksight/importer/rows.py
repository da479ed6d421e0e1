"""Rows an import builds up for one run, and the names every importer shares.

Imported artifacts are mapped into the store's own tables (``ranks``, ``steps``,
``phases``, ``collectives``, ``progress``, ``stacks``, ``fr_dumps``, ``fr_entries``), so the
analyzer, the report and the UI read an imported run as they read a hooked one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ranksight.store.fit import fit_rank

_OPS = {
    "allreduce": "all_reduce",
    "allgather": "all_gather",
    "allgatherbase": "all_gather",
    "allgatherintocoalesced": "all_gather",
    "reducescatter": "reduce_scatter",
    "reducescatterbase": "reduce_scatter",
    "reducescattertensorcoalesced": "reduce_scatter",
    "broadcast": "broadcast",
    "reduce": "reduce",
    "alltoall": "all_to_all",
    "alltoallbase": "all_to_all",
    "alltoallv": "all_to_all",
    "gather": "gather",
    "scatter": "scatter",
    "barrier": "barrier",
    "send": "send",
    "recv": "recv",
    "sendrecv": "send_recv",
    "coalesced": "coalesced",
}


def norm_op(name: str) -> str:
    """The field's name of a collective from any spelling: ``nccl:all_reduce``,
    ``ALLREDUCE``, ``AllReduce``, ``_all_gather_base``, ``ncclDevKernel_AllGather_RING_LL``,
    ``nccl:send 0->1`` -> ``all_reduce``, ``all_gather``, ``send``. Unknown names come back
    lower-cased."""
    s = name.split(":", 1)[-1].strip()
    s = re.sub(r"^nccl(Dev)?Kernel_", "", s)
    s = s.split("(")[0].split(" ")[0]
    s = re.sub(r"_(RING|TREE|NVLS|NVLSTREE|COLLNET\w*|PAT)(_.*)?$", "", s, flags=re.I)
    key = s.lower().replace("_", "")
    return _OPS.get(key, s.lower().strip("_"))


def group_id(desc: str, ranks: list[int] | tuple[int, ...]) -> str:
    """A process group's id, the same on every rank: its description (``default_pg``,
    ``TENSOR_MODEL_PARALLEL_GROUP``) and member ranks: ``default_pg[0,1,2,3]``."""
    return f"{desc or 'pg'}[{','.join(str(r) for r in sorted(ranks))}]"


def ranks_text(ranks: list[int] | tuple[int, ...]) -> str:
    """Member ranks as the ``group_ranks`` column holds them: ``"0,1,2,3"``."""
    return ",".join(str(r) for r in sorted(ranks))


def parse_ranks(text: str) -> list[int]:
    """``"[0, 1, 2]"`` or ``"0,1,2"`` -> ``[0, 1, 2]`` (anything else: ``[]``; numbers of
    more than 12 digits, which name no rank, left out)."""
    return [int(x) for x in re.findall(r"-?\d+", str(text)) if len(x) <= 13]


_RANK_PATTERNS = (
    re.compile(r"rank[_\-]?(\d+)", re.I),
    re.compile(r"_dump_(\d+)$"),
    re.compile(r"(?:worker|proc|process|trace|dump)[_\-]?(\d+)$", re.I),
)


def rank_from_path(path: str) -> int | None:
    """A rank number in a file name: ``rank3.log``, ``trace_rank-1.json.gz``,
    ``nccl_trace_rank_3``, ``_dump_12``, ``worker7.txt`` -> 3, 1, 3, 12, 7; else None
    (``part1.log``, ``console2.txt``: a number that names no rank; ``rank99999999999``:
    a number no rank can be, :func:`~ranksight.store.fit.fit_rank`)."""
    name = path.replace("\\", "/").rsplit("/", 1)[-1]
    stem = name
    while True:
        cut = re.sub(r"\.(gz|pkl|pickle|json|log|txt|out|err|trace)$", "", stem, flags=re.I)
        if cut == stem:
            break
        stem = cut
    for pattern in _RANK_PATTERNS:
        m = pattern.search(stem)
        if m:
            return fit_rank(m.group(1))
    return None


@dataclass
class Rows:
    """Rows per table, as dicts without ``run_id``/``attempt`` (added when written)."""

    tables: dict[str, list[dict]] = field(default_factory=dict)

    def add(self, table: str, row: dict) -> None:
        """Append one row to ``table``."""
        self.tables.setdefault(table, []).append(row)

    def extend(self, table: str, rows: list[dict]) -> None:
        """Append ``rows`` to ``table``."""
        self.tables.setdefault(table, []).extend(rows)

    def count(self) -> int:
        """Rows held, all tables."""
        return sum(len(v) for v in self.tables.values())

    def merge(self, other: Rows) -> None:
        """Append every row of ``other``."""
        for table, rows in other.tables.items():
            self.extend(table, rows)
