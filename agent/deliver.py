"""Idempotent delivery of a sealed batch: each piece lands once, however often it is sent.

A piece is one table's rows of one batch in one storage partition (``Store.partitions``:
the month on the server, whose MergeTree writes one part per partition; chdb: the whole
table). Its id, ``blake2b(uid, table, partition)`` of the batch's random ``uid``, is the
same on every retry and after an agent restart, and goes into the ``batch_id`` column of
every row (``schema.DELIVERED_TABLES``). One piece is one insert of at most
``MAX_ATOMIC_ROWS`` rows: one block, written as one part on ClickHouse (temp folder then
rename) and as one segment on chdb (temp file then link), so it is stored whole or not
at all.

A batch sent for the first time is inserted directly. A batch that was tried before (an
insert failed, timed out, or the agent died with it in flight) is checked first: wait
until the store runs no insert of its pieces any more (a timed-out insert can still
finish on a stalled server), count its pieces' rows (``Store.stored_batches``), and send
only pieces with none. This works the same on ClickHouse 18.16 (no insert deduplication
for plain MergeTree), current ClickHouse and chdb, and needs no change to any reader's
query. Tables without a ``batch_id`` column are delivered at least once.
"""

from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa

from ranksight.store import Store, StoreError, schema
from ranksight.store.base import MAX_ATOMIC_ROWS
from ranksight.store.cluster import shard_groups

from .buffer import SealedBatch

log = logging.getLogger("ranksight.agent")


@dataclass(frozen=True, slots=True)
class Delivered:
    """What sending one batch did: rows inserted, rows found already stored (a retry of a
    batch that had landed), and rows of pieces found partly stored (never expected)."""

    inserted: int
    already_stored: int
    partial: int


def piece_id(uid: int, table: str, partition: int, chunk: int = 0) -> int:
    """The delivery id of ``table``'s rows of batch ``uid`` in ``partition`` (``chunk``:
    which ``MAX_ATOMIC_ROWS`` slice of them, for a piece too big for one insert): 64 bits
    of blake2b, never 0 (0 marks rows not written by the agent)."""
    key = f"{uid}:{table}:{partition}" + (f":{chunk}" if chunk else "")
    digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") or 1


def pieces(store: Store, table: str, uid: int, rows: pa.Table) -> list[tuple[int, pa.Table]]:
    """``rows`` split by the store's partition key (and, on a cluster, by sharding-key
    value, so that each piece lands on one shard as one part), each with its
    :func:`piece_id`."""
    spec = schema.table(table)
    keys = None
    if spec.time_column and spec.time_column in rows.column_names:
        times = pd.DataFrame({spec.time_column: rows.column(spec.time_column).to_numpy()})
        keys = store.partitions(table, times)
    shard = store.shard_column(table)
    if shard and shard in rows.column_names:  # a cluster: one piece per shard-key value too
        groups = shard_groups(rows.column(shard))
        keys = groups if keys is None else keys * (1 << 32) + groups
    if keys is None or (keys == keys[0]).all():
        parts = [(int(keys[0]) if keys is not None else 0, rows)]
    else:
        parts = [(int(key), rows.filter(pa.array(keys == key))) for key in np.unique(keys)]
    out = []
    for key, part in parts:  # at most MAX_ATOMIC_ROWS a piece: one insert, stored whole
        for chunk, start in enumerate(range(0, part.num_rows, MAX_ATOMIC_ROWS)):
            out.append((piece_id(uid, table, key, chunk), part.slice(start, MAX_ATOMIC_ROWS)))
    return out


def deliver(store: Store, batch: SealedBatch, *, verify: bool, settle_s: float) -> Delivered:
    """Send every piece of ``batch`` that is not stored yet; with ``verify`` (the batch
    was tried before) check each first, once no insert of any of them can still land
    (:func:`settle`). Raises StoreError on any failure (the caller retries the whole batch
    with ``verify=True``)."""
    inserted = already = partial = 0
    split = {
        table: pieces(store, table, batch.uid, rows)
        for table, rows in batch.tables.items()
        if rows.num_rows and table in schema.DELIVERED_TABLES
    }
    if verify:
        settle(store, [pid for parts in split.values() for pid, _ in parts], settle_s)
    for table, rows in batch.tables.items():
        if rows.num_rows and table not in schema.DELIVERED_TABLES:
            inserted += store.insert(table, rows)
    for table, parts in split.items():
        for pid, part in parts:
            stored = store.stored_batches(table, [pid]).get(pid, 0) if verify else 0
            if stored == part.num_rows:
                already += stored
            elif stored:
                log.error(
                    "batch %d: %s piece %016x has %d of %d rows stored; not resent",
                    batch.seq, table, pid, stored, part.num_rows,
                )  # fmt: skip
                partial += stored
            else:
                inserted += store.insert(table, part, batch_id=pid)
    return Delivered(inserted, already, partial)


def settle(store: Store, pids: list[int], settle_s: float) -> None:
    """Return once no insert of pieces ``pids`` runs in the store and none has for
    ``store.insert_grace_s`` seconds in a row, so that counting their rows next is final:
    an insert whose client gave up (a timeout on a stalled server) may still be written,
    and one the server had received whole before it stalled shows in its process list
    only once the server runs again. Raises StoreError after ``settle_s`` seconds."""
    if not pids:
        return
    deadline = time.monotonic() + settle_s
    clear_since = None
    while True:
        now = time.monotonic()
        if store.inserts_in_flight(pids):
            clear_since = None
        elif clear_since is None:
            clear_since = now
        if clear_since is not None and now - clear_since >= store.insert_grace_s:
            return
        if now > deadline:
            raise StoreError(f"an insert of piece(s) {pids[:3]} is still running")
        time.sleep(min(0.2, store.insert_grace_s) or 0.2)
