"""One collective, one row: Kineto kernels and Flight Recorder entries of the same job.

A Flight Recorder dump numbers a group's collectives from the group's creation (1, 2, ...);
a profiler trace holds only the steps it recorded, and :mod:`.kineto` numbers their NCCL
kernels from 0. Where both name the same process group (the kernel args' ``Process Group
Description`` and ``Process Group Ranks`` give the same ``group_id``), the two numberings
would put different collectives at one sequence number: a false desync, and every
collective twice.

So each rank's kernels of such a group are placed in the dump's numbering: the offset at
which every kernel's op and element count equal the dump entry's, and no kernel starts
before its entry was created (a kernel runs after it is enqueued; ``CLOCK_TOLERANCE_NS``
allows for the two clocks), the earliest such start (kernels of a periodic step pattern
match at every step's offset; only the right one starts right after its entries were
created, the later offsets would start before them). The matched dump row takes the
kernel's device times and step; kernels outside the dump's window are added, renumbered.
Kernels that fit no offset keep their own numbering under the group id with ``~kineto``
after its name, so they are compared only with other ranks' unmatched kernels.
"""

from __future__ import annotations

import numpy as np

CLOCK_TOLERANCE_NS = 5_000_000
"""How far (ns) a kernel may seem to start before its Flight Recorder entry was created
(profiler and dump clocks of one host; 5 ms)."""


def fr_index(rows: list[dict]) -> dict[tuple[int, str], dict[int, dict]]:
    """(rank, group_id) -> {group_seq: row} of Flight Recorder collective rows."""
    out: dict[tuple[int, str], dict[int, dict]] = {}
    for r in rows:
        out.setdefault((int(r["rank"]), r["group_id"]), {})[int(r["group_seq"])] = r
    return out


def _same(k: dict, f: dict) -> bool:
    if k["op"] != f["op"]:
        return False
    return not (k["numel_in"] and f["numel_in"] and k["numel_in"] != f["numel_in"])


def offset(kernels: list[dict], entries: dict[int, dict]) -> int | None:
    """The dump sequence number of ``kernels[0]`` (kernels of one rank and group, in
    order), or None when no offset fits (see the module doc)."""
    if not kernels or not entries:
        return None
    best: tuple[float, int] | None = None
    seqs = sorted(entries)
    for s0 in range(seqs[0] - len(kernels) + 1, seqs[-1] + 1):
        lags, ok = [], True
        for i, k in enumerate(kernels):
            f = entries.get(s0 + i)
            if f is None:
                continue
            if not _same(k, f):
                ok = False
                break
            lags.append(k["start_ns"] - int(f["enqueue_ns"]))
        if not ok or not lags:
            continue
        first = float(np.min(lags))
        if first < -CLOCK_TOLERANCE_NS:
            continue
        if best is None or first < best[0]:
            best = (first, s0)
    return None if best is None else best[1]


def merge_kineto(kernels: list[dict], index: dict[tuple[int, str], dict[int, dict]]) -> list[dict]:
    """Kineto collective rows of one rank -> the rows to add. Rows of a group the dumps
    also hold are matched (see the module doc): a matched dump row gets the kernel's
    ``step``, ``start_ns`` and ``end_ns`` in place (in ``index``'s rows; its op, sizes,
    dtype and enqueue time stay the dump's) and the kernel is not returned; the rest come back renumbered, or under ``<name>~kineto[...]``."""
    by_group: dict[tuple[int, str], list[dict]] = {}
    for k in kernels:
        by_group.setdefault((int(k["rank"]), k["group_id"]), []).append(k)
    out: list[dict] = []
    for key, ks in by_group.items():
        entries = index.get(key)
        if not entries:
            out.extend(ks)
            continue
        ks.sort(key=lambda k: k["group_seq"])
        s0 = offset(ks, entries)
        if s0 is None:
            name, _, members = key[1].partition("[")
            for k in ks:
                out.append({**k, "group_id": f"{name}~kineto[{members}"})
            continue
        for i, k in enumerate(ks):
            f = entries.get(s0 + i)
            if f is None:
                out.append({**k, "group_seq": s0 + i})
            else:
                f.update(step=k["step"], start_ns=k["start_ns"], end_ns=k["end_ns"])
    return out
