"""``ranksight stacks --run RUN``: dump the Python stacks of a run's ranks on this node now.

The ranks are those of the run's spool files here (live processes), plus any pid the
store's ``ranks`` table places on this host; every one is checked against the spool
before py-spy touches it (``collectors/local_ranks.py:rank_problem``), so a forged row or
a reused pid is refused and named, never dumped. The ranks that pass are dumped at once
with py-spy and stored in ``stacks`` (trigger ``manual``). The printout groups ranks
whose main-thread stacks are the same, largest group first, so in a hang the odd group
out stands apart; refused ranks follow, with why.
"""

from __future__ import annotations

import socket
from collections import defaultdict

from ranksight.collectors.base import frame
from ranksight.collectors.local_ranks import LocalRank, from_store, scan_spool
from ranksight.collectors.pyspy import PySpyConfig, StackTaker, main_thread
from ranksight.store import Store


def run_ranks(
    store: Store, run_id: str, spool_dir: str, host: str, attempt: int | None = None
) -> list[LocalRank]:
    """Candidate ranks of ``run_id`` on this node (latest attempt unless ``attempt``):
    those of its live spool files, and those the ``ranks`` table names with a live pid
    the spool does not (``spool_path`` empty: :class:`StackTaker` refuses them). Raises
    StoreError if the store cannot be read."""
    spooled = [r for r in scan_spool(spool_dir) if r.run_id == run_id]
    if attempt is None and spooled:
        attempt = max(r.attempt for r in spooled)
    spooled = [r for r in spooled if attempt is None or r.attempt == attempt]
    listed = from_store(store, run_id, host, attempt)
    if attempt is None and listed:
        attempt = max(r.attempt for r in listed)
    known = {(r.attempt, r.rank, r.pid) for r in spooled}
    extra = [r for r in listed if r.attempt == attempt and (r.attempt, r.rank, r.pid) not in known]
    return sorted(spooled + extra, key=lambda r: (r.rank, r.pid))


def take_stacks(
    store: Store,
    run_id: str,
    *,
    spool_dir: str,
    attempt: int | None = None,
    host: str | None = None,
    config: PySpyConfig | None = None,
    trigger: str = "manual",
) -> list[dict]:
    """Dump every proven live local rank of ``run_id``, store the ``stacks`` rows, and
    return them followed by the rows of the ranks refused (``ok`` 0, error ``refused:
    ...``; not stored). Empty if the run has no live rank here. Raises Unavailable
    without py-spy, StoreError if the store fails."""
    host = host or socket.gethostname()
    taker = StackTaker(host, config)
    ranks = run_ranks(store, run_id, spool_dir, host, attempt)
    rows = taker.take(ranks, trigger)
    if rows:
        store.insert("stacks", frame("stacks", rows))
    return rows + taker.refused


def group_stacks(rows: list[dict]) -> list[tuple[str, list[int]]]:
    """``[(main-thread stack, ranks)]`` for dumps that worked, largest group first."""
    groups: dict[str, list[int]] = defaultdict(list)
    for r in rows:
        if r["ok"]:
            groups[main_thread(r["summary"])].append(int(r["rank"]))
    return sorted(((k, sorted(v)) for k, v in groups.items()), key=lambda g: (-len(g[1]), g[1]))


def format_stacks(rows: list[dict]) -> str:
    """Plain-text report: groups of equal main-thread stacks, then failed dumps."""
    out = []
    for stack, ranks in group_stacks(rows):
        out.append(f"ranks {','.join(map(str, ranks))} ({len(ranks)}):")
        out.extend(f"    {part}" for part in stack.split(" <- "))
    for r in rows:
        if not r["ok"]:
            out.append(f"rank {r['rank']} (pid {r['pid']}): no stack: {r['error']}")
    return "\n".join(out)
