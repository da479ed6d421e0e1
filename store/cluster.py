"""The schema on a ClickHouse cluster: local tables on every node, Distributed tables on top.

Layout in database ``DB`` on every node of cluster ``NAME`` (``<remote_servers>`` in the
servers' config, ``deploy/clickhouse/cluster/``):

- ``<table>_local``: the data, one MergeTree per node (``ReplicatedMergeTree`` with the
  ZooKeeper path ``/clickhouse/tables/{shard}/DB/<table>`` and replica ``{replica}``, both
  from each server's ``<macros>``, when the shards have replicas);
- ``<table>``: ``Distributed(NAME, DB, <table>_local, <sharding key>)``, under the names
  every reader and writer already uses, so the analyzer, UI and agent run unchanged;
- ``schema_version``: a plain table on each node (each node records what it was brought to).

Sharding key: ``cityHash64(run_id)`` for every table with a ``run_id`` (the hooks' tables,
findings, per-process samples, stacks, Flight Recorder), ``cityHash64(host)`` for the node
tables. All rows of one run live on one shard, so the analyzer's joins and ``IN``
sub-queries (which join a run's collectives with themselves) run shard-locally with
``distributed_product_mode = 'local'`` (the server store sets it): exact, and no rows move
between shards; the other shards skip the run through the primary key (``run_id`` first).
Load spreads over shards by run: a cluster serves many jobs at once, and one job's
records per day (``docs/scale-out.md``) fit one shard.

The Distributed tables leave out the ``time`` column: 18.16 refuses to forward a
MATERIALIZED column to the shards ("Cannot insert column time"), and each local table
computes it from the nanosecond time itself. No ``ON CLUSTER`` DDL (it needs ZooKeeper):
:func:`init_cluster` connects to every node that ``system.clusters`` lists and runs each
statement there.
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ranksight.ground.words import counted
from ranksight.store import schema
from ranksight.store.base import StoreError
from ranksight.store.ddl import check_identifier, create_database_sql, create_table_sql
from ranksight.store.schema import Table

LOCAL_SUFFIX = "_local"
"""Name suffix of the per-node tables that hold the data."""
ZK_PATH = "/clickhouse/tables/{shard}/%s/%s"
"""ZooKeeper path of a replicated local table (database, table); ``{shard}`` is a macro."""
_DISTRIBUTED = re.compile(r"^Distributed\(\s*'?([A-Za-z0-9_]+)'?\s*,")


def shard_column(table: Table) -> str | None:
    """The column whose hash picks a row's shard: ``run_id``, else ``host``; None for a
    table kept per node (``schema_version``)."""
    if table.name == schema.SCHEMA_VERSION_TABLE.name:
        return None
    for column in ("run_id", "host"):
        if column in table.column_names:
            return column
    return None


def distributed_tables() -> list[Table]:
    """The tables that get a local table and a Distributed table (all but schema_version)."""
    return [t for t in schema.TABLES.values() if shard_column(t) is not None]


def local_table_sql(table: Table, database: str, replicated: bool) -> str:
    """``CREATE TABLE IF NOT EXISTS DB.<table>_local`` (MergeTree or ReplicatedMergeTree)."""
    engine = "MergeTree()"
    if replicated:
        engine = f"ReplicatedMergeTree('{ZK_PATH % (database, table.name)}', '{{replica}}')"
    local = Table(
        table.name + LOCAL_SUFFIX, table.columns, table.order_by, table.time_column, engine
    )
    return create_table_sql(local, database)


def distributed_table_sql(table: Table, database: str, cluster: str) -> str:
    """``CREATE TABLE IF NOT EXISTS DB.<table>`` as a Distributed table over the local ones
    (the schema's columns, no ``time``)."""
    db, name = check_identifier(database), check_identifier(cluster)
    columns = ",\n".join(f"    {c} {t}" for c, t in table.columns)
    key = f"cityHash64({shard_column(table)})"
    return (
        f"CREATE TABLE IF NOT EXISTS {db}.{table.name}\n(\n{columns}\n)\n"
        f"ENGINE = Distributed({name}, {db}, {table.name}{LOCAL_SUFFIX}, {key})"
    )


def cluster_schema_sql(
    database: str, cluster: str, replicated: bool, found: dict[str, dict[str, str]]
) -> list[str]:
    """Statements that bring one node whose tables have the columns ``found`` (table ->
    column -> type) to the cluster schema: the database (when it has no tables), schema_version, each missing
    local and Distributed table, each missing column (``ALTER ... ADD COLUMN ... AFTER``).
    Raises StoreError naming a column whose type differs."""
    from ranksight.store.migrate import type_mismatch

    db = check_identifier(database)
    out = [] if found else [create_database_sql(db)]
    if schema.SCHEMA_VERSION_TABLE.name not in found:
        out.append(create_table_sql(schema.SCHEMA_VERSION_TABLE, db))
    for table in distributed_tables():
        for name, create in (
            (table.name + LOCAL_SUFFIX, local_table_sql(table, db, replicated)),
            (table.name, distributed_table_sql(table, db, cluster)),
        ):
            have = found.get(name)
            if have is None:
                out.append(create)
                continue
            previous = None
            for column, ch_type in table.columns:
                if column not in have:
                    after = f" AFTER {previous}" if previous else ""
                    out.append(f"ALTER TABLE {db}.{name} ADD COLUMN {column} {ch_type}{after}")
                elif have[column] != ch_type:
                    raise type_mismatch(name, column, have[column], ch_type)
                previous = column
    return out


@dataclass(frozen=True, slots=True)
class ClusterNode:
    """One server of a cluster as ``system.clusters`` lists it (shard and replica count
    from 1)."""

    shard: int
    replica: int
    host: str
    port: int

    def __str__(self) -> str:
        return f"shard {self.shard} replica {self.replica} ({self.host}:{self.port})"


def cluster_nodes(store, cluster: str) -> list[ClusterNode]:
    """The nodes of ``cluster`` as the server behind ``store`` (a ClickHouseStore) knows
    them. Raises StoreError listing the clusters it does know if ``cluster`` is not one."""
    check_identifier(cluster)
    rows = store.admin_rows(
        "SELECT cluster, shard_num, replica_num, host_address, port FROM system.clusters"
    )
    mine = sorted((int(s), int(r), str(h), int(p)) for c, s, r, h, p in rows if c == cluster)
    if not mine:
        known = ", ".join(sorted({c for c, *_ in rows})) or "none"
        raise StoreError(
            f"{store.url}: the server knows no cluster {cluster!r} (its <remote_servers>: "
            f"{known}); see deploy/clickhouse/cluster/"
        )
    return [ClusterNode(*row) for row in mine]


@dataclass(frozen=True, slots=True)
class ClusterInit:
    """What :func:`init_cluster` did (or, dry, would do): statements per node."""

    cluster: str
    database: str
    replicated: bool
    statements: dict[ClusterNode, tuple[str, ...]]

    def describe(self) -> str:
        """One block per node: a line naming it, then its statements (or "up to date")."""
        lines = [
            f"cluster {self.cluster}, database {self.database}, "
            f"{'ReplicatedMergeTree' if self.replicated else 'MergeTree'} local tables"
        ]
        for node, stmts in self.statements.items():
            lines.append(
                f"-- {node}: {counted(len(stmts), 'statement') if stmts else 'up to date, no statements'}"
            )
            lines += [s.replace("\n", " ") + ";" for s in stmts]
        return "\n".join(lines)


def init_cluster(
    store, cluster: str, replicated: bool | None = None, dry_run: bool = False
) -> ClusterInit:
    """Create or extend the cluster schema on every node of ``cluster`` (see the module
    doc), reaching each node with ``store``'s user and password, and record the schema
    version on each. ``replicated`` None: replicated local tables when any shard has more
    than one replica. Idempotent (additions only). Raises StoreError naming the node that
    fails (a replicated table on a server without ZooKeeper fails there)."""
    nodes = cluster_nodes(store, cluster)
    if replicated is None:
        replicated = any(n.replica > 1 for n in nodes)
    plan: dict[ClusterNode, tuple[str, ...]] = {}
    for node in nodes:
        with store.sibling(node.host, node.port) as peer:
            try:
                stmts = cluster_schema_sql(store.database, cluster, replicated, peer.columns())
                if not dry_run:
                    peer.run_ddl(stmts, tolerate_existing=replicated)
                    if peer.schema_version() < schema.SCHEMA_VERSION:
                        peer.record_schema_version(schema.SCHEMA_VERSION)
            except StoreError as exc:
                raise StoreError(f"cluster {cluster}, {node}: {exc}") from None
        plan[node] = tuple(stmts)
    return ClusterInit(cluster, store.database, replicated, plan)


def cluster_of(engines: dict[str, str]) -> str | None:
    """The cluster name if the schema's tables in ``engines`` (table -> ``engine_full``)
    are Distributed tables, else None."""
    for table in distributed_tables():
        m = _DISTRIBUTED.match(engines.get(table.name, ""))
        if m:
            return m.group(1)
    return None


def shard_groups(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """Per row, a stable int key (CRC-32 of the value) that is equal for rows of one
    sharding-key value: rows with equal keys go to one shard."""
    encoded = pc.dictionary_encode(column)
    if isinstance(encoded, pa.ChunkedArray):
        encoded = encoded.combine_chunks()
    words = np.array(
        [zlib.crc32(str(v).encode()) for v in encoded.dictionary.to_pylist()] + [0],
        dtype=np.int64,
    )
    return words[encoded.indices.to_numpy(zero_copy_only=False)]
