"""ClickHouse column types as Arrow types, the way ClickHouse's own Arrow format maps them.

Both backends hand results over as Arrow tables converted to pandas, so a query gives
the same dtypes on either: ``UInt32`` -> ``uint32``, ``Int64`` -> ``int64``, ``Float64``
-> ``float64``, ``String`` -> ``str``; ``Nullable(T)`` is ``T`` with nulls (integers with
nulls become ``float64`` in pandas); ``DateTime`` is ``uint32`` seconds since the epoch
(ClickHouse's Arrow mapping); ``Array(T)`` is an object column of numpy arrays.
"""

from __future__ import annotations

import re

import pyarrow as pa

from ranksight.store.schema import Table

_SIMPLE: dict[str, pa.DataType] = {
    "UInt8": pa.uint8(),
    "UInt16": pa.uint16(),
    "UInt32": pa.uint32(),
    "UInt64": pa.uint64(),
    "Int8": pa.int8(),
    "Int16": pa.int16(),
    "Int32": pa.int32(),
    "Int64": pa.int64(),
    "Float32": pa.float32(),
    "Float64": pa.float64(),
    "String": pa.string(),
    "Date": pa.uint16(),
    "DateTime": pa.uint32(),
}

_WRAPPER = re.compile(r"^(Nullable|LowCardinality|Array)\((.*)\)$")


def arrow_type(ch_type: str) -> pa.DataType | None:
    """The Arrow type for ClickHouse type ``ch_type`` (``"UInt32"``, ``"Nullable(String)"``,
    ``"Array(Int64)"``, ...); ``None`` for types without a fixed mapping (then pyarrow
    infers one from the values)."""
    ch_type = ch_type.strip()
    if ch_type in _SIMPLE:
        return _SIMPLE[ch_type]
    if ch_type.startswith("FixedString("):
        return pa.string()
    if ch_type.startswith("DateTime("):  # DateTime('UTC')
        return pa.uint32()
    match = _WRAPPER.match(ch_type)
    if not match:
        return None
    inner = arrow_type(match.group(2))
    if inner is None:
        return None
    return pa.list_(inner) if match.group(1) == "Array" else inner


def table_schema(table: Table) -> pa.Schema:
    """The Arrow schema of ``table``'s columns (no nulls allowed). Raises ValueError for a
    column type without a mapping."""
    fields = []
    for name, ch_type in table.columns:
        arrow = arrow_type(ch_type)
        if arrow is None or ch_type.startswith(("Nullable", "Array")):
            raise ValueError(f"{table.name}.{name}: type {ch_type} has no segment mapping")
        fields.append(pa.field(name, arrow, nullable=False))
    return pa.schema(fields)


def structure(table: Table) -> str:
    """``table``'s columns as a ClickHouse structure string: ``"run_id String, ..."``."""
    return ", ".join(f"{name} {ch_type}" for name, ch_type in table.columns)
