"""CREATE statements for the server store, in SQL that ClickHouse 18.16 and 26.x both accept.

Tables with a ``time_column`` get a ``time DateTime`` column MATERIALIZED from it
(seconds, from the nanosecond value) and are partitioned by month of it; writers never
send ``time``, and ``SELECT *`` does not return it. Tables without one (``schema_version``)
are unpartitioned. No LowCardinality, codecs or TTL (18.16 has none of them).
"""

from __future__ import annotations

import re

from ranksight.store.schema import TABLES, Table

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def check_identifier(name: str) -> str:
    """``name`` if it is a plain SQL identifier (letters, digits, ``_``), else ValueError."""
    if not _IDENTIFIER.match(name):
        raise ValueError(f"{name!r} is not a plain identifier (letters, digits, _)")
    return name


def create_database_sql(database: str) -> str:
    """``CREATE DATABASE IF NOT EXISTS <database>``."""
    return f"CREATE DATABASE IF NOT EXISTS {check_identifier(database)}"


def create_table_sql(table: Table, database: str | None = None) -> str:
    """``CREATE TABLE IF NOT EXISTS`` for ``table`` (in ``database`` if given) as a
    MergeTree ordered by the table's sort key."""
    name = f"{check_identifier(database)}.{table.name}" if database else table.name
    columns = [f"    {column} {ch_type}" for column, ch_type in table.columns]
    partition = ""
    if table.time_column:
        columns.append(
            f"    time DateTime MATERIALIZED toDateTime(intDiv({table.time_column}, 1000000000))"
        )
        partition = "PARTITION BY toYYYYMM(time)\n"
    body = ",\n".join(columns)
    return (
        f"CREATE TABLE IF NOT EXISTS {name}\n(\n{body}\n)\n"
        f"ENGINE = {table.engine}\n{partition}ORDER BY ({', '.join(table.order_by)})"
    )


def schema_changes_sql(found: dict[str, dict[str, str]], database: str) -> list[str]:
    """Statements that bring a database whose tables have the columns ``found`` (table ->
    column -> type, as ``system.columns`` lists them) up to ``schema.TABLES``: ``CREATE
    TABLE`` for a missing table, ``ALTER TABLE ... ADD COLUMN ... AFTER`` for a missing
    column (18.16 has no ``IF NOT EXISTS`` there). Raises StoreError naming a column whose
    type differs."""
    from ranksight.store.migrate import type_mismatch

    out = []
    for table in TABLES.values():
        have = found.get(table.name)
        if have is None:
            out.append(create_table_sql(table, database))
            continue
        previous = None
        for column, ch_type in table.columns:
            if column not in have:
                after = f" AFTER {previous}" if previous else ""
                out.append(
                    f"ALTER TABLE {check_identifier(database)}.{table.name} "
                    f"ADD COLUMN {column} {ch_type}{after}"
                )
            elif have[column] != ch_type:
                raise type_mismatch(table.name, column, have[column], ch_type)
            previous = column
    return out
