"""``ranksight stacks --run RUN``: dump the Python stacks of a run's ranks on this node now.

The ranks are found in the spool (live processes) or, failing that, in the store's
``ranks`` table for this host; all are dumped at once with py-spy and stored in
``stacks`` (trigger ``manual``). The printout groups ranks whose main-thread stacks are
the same, largest group first, so in a hang the odd group out stands apart.
"""

from __future__ import annotations

import socket
from collections import defaultdict

from ranksight.collectors.base import frame
from ranksight.collectors.local_ranks import LocalRank, from_store, scan_spool
from ranksight.collectors.pyspy import PySpyConfig, StackTaker
from ranksight.store import Store


def run_ranks(
    store: Store, run_id: str, spool_dir: str, host: str, attempt: int | None = None
) -> list[LocalRank]:
    """Live ranks of ``run_id`` on this node: from the spool, else from the store (latest
    attempt unless ``attempt``). Raises StoreError if the store is needed and unreadable."""
    found = [r for r in scan_spool(spool_dir) if r.run_id == run_id]
    if attempt is not None:
        found = [r for r in found if r.attempt == attempt]
    elif found:
        latest = max(r.attempt for r in found)
        found = [r for r in found if r.attempt == latest]
    return found or from_store(store, run_id, host, attempt)


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
    """Dump every live local rank of ``run_id``, store the ``stacks`` rows, return them
    (empty if the run has no live rank here). Raises Unavailable without py-spy,
    StoreError if the store fails."""
    host = host or socket.gethostname()
    taker = StackTaker(host, config)
    ranks = run_ranks(store, run_id, spool_dir, host, attempt)
    rows = taker.take(ranks, trigger)
    if rows:
        store.insert("stacks", frame("stacks", rows))
    return rows


def main_thread(summary: str) -> str:
    """The main thread's line of a stack summary (else its first line), without the
    thread id, so equal stacks of different processes compare equal."""
    lines = summary.splitlines()
    line = next((ln for ln in lines if ln.startswith("MainThread")), lines[0] if lines else "")
    name, _, rest = line.partition(" (")
    return f"{name}: {rest.partition(': ')[2]}" if rest else line


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
