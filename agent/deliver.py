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


def piece_id(uid: int, table: str, partition: int) -> int:
    """The delivery id of ``table``'s rows of batch ``uid`` in ``partition``: 64 bits of
    blake2b, never 0 (0 marks rows not written by the agent)."""
    digest = hashlib.blake2b(f"{uid}:{table}:{partition}".encode(), digest_size=8).digest()
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
        return [(piece_id(uid, table, int(keys[0]) if keys is not None else 0), rows)]
    out = []
    for key in np.unique(keys):
        part = rows.filter(pa.array(keys == key))
        out.append((piece_id(uid, table, int(key)), part))
    return out


def deliver(store: Store, batch: SealedBatch, *, verify: bool, settle_s: float) -> Delivered:
    """Send every piece of ``batch`` that is not stored yet; with ``verify`` (the batch
    was tried before) check each first. Raises StoreError on any failure (the caller
    retries the whole batch with ``verify=True``)."""
    inserted = already = partial = 0
    for table, rows in batch.tables.items():
        if rows.num_rows == 0:
            continue
        if table not in schema.DELIVERED_TABLES:
            inserted += store.insert(table, rows)
            continue
        for pid, part in pieces(store, table, batch.uid, rows):
            stored = _stored(store, table, pid, settle_s) if verify else 0
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


def _stored(store: Store, table: str, pid: int, settle_s: float) -> int:
    """Rows of piece ``pid`` in ``table`` once no insert of it runs any more."""
    deadline = time.monotonic() + settle_s
    while store.inserts_in_flight([pid]):
        if time.monotonic() > deadline:
            raise StoreError(f"an insert of piece {pid:016x} into {table} is still running")
        time.sleep(0.2)
    return store.stored_batches(table, [pid]).get(pid, 0)
