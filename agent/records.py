"""Validate spool records one by one (the exact reference path) into typed Arrow tables.

A record is a JSON object whose ``"t"`` names its table (:data:`ACCEPTED_TABLES`); its
other keys are columns of that table. ``run_id``, ``attempt`` and ``rank`` come from the
spool file's header unless the record sets them. A missing or ``null`` column takes the
column's default (0, ``""``, NaN for Float64, as "not measured"). A record is rejected,
with a reason, for: an unknown table, an unknown or reserved column (``batch_id``, set
by the agent), a value of the wrong type (a string for a number, a bool, an object), an
integer out of the column type's range, or a string over :data:`MAX_STRING` characters.

``agent/parse.py`` does the same vectorized; this module is what it falls back to for a
chunk it cannot parse whole, and its test oracle.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from ranksight.store import schema
from ranksight.store.types import table_schema

ACCEPTED_TABLES = ("runs", *schema.RECORD_TABLES)
"""Tables whose records ranks may hand to the agent."""
RESERVED = frozenset({"batch_id"})
"""Columns only the agent sets."""
MAX_STRING = 1 << 20
"""Longest string value accepted, characters (1 Mi): a longer one is a malformed record."""
_INT_RANGE = {
    "UInt8": (0, (1 << 8) - 1),
    "UInt32": (0, (1 << 32) - 1),
    "UInt64": (0, (1 << 64) - 1),
    "Int32": (-(1 << 31), (1 << 31) - 1),
    "Int64": (-(1 << 63), (1 << 63) - 1),
}


def record_schema(name: str) -> pa.Schema:
    """The Arrow schema of table ``name``'s records as the agent buffers them: the table's
    columns without the reserved ones."""
    full = table_schema(schema.TABLES[name])
    return pa.schema([f for f in full if f.name not in RESERVED])


def default_of(ch_type: str) -> Any:
    """The value a missing column takes: ``""``, NaN (Float64) or 0."""
    if ch_type == "String":
        return ""
    return math.nan if ch_type == "Float64" else 0


def coerce(value: Any, ch_type: str) -> Any:
    """``value`` checked for a column of ClickHouse type ``ch_type``; raises TypeError or
    ValueError saying what is wrong."""
    if value is None:
        return default_of(ch_type)
    if ch_type == "String":
        if not isinstance(value, str):
            raise TypeError(f"expected a string, got {type(value).__name__}")
        if len(value) > MAX_STRING:
            raise ValueError(f"string of {len(value)} chars is over {MAX_STRING}")
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"expected a number, got {type(value).__name__}")
    if ch_type == "Float64":
        return float(value)
    if isinstance(value, float):
        if not (math.isfinite(value) and value == int(value)):
            raise TypeError(f"expected an integer, got {value!r:.40}")
        value = int(value)
    low, high = _INT_RANGE[ch_type]
    if not low <= value <= high:
        raise ValueError(f"{value} is out of range for {ch_type}")
    return value


@dataclass
class Batch:
    """Rows gathered per table plus rejected records with their reasons."""

    rows: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    rejected: list[str] = field(default_factory=list)

    def add(self, record: dict[str, Any], base: dict[str, Any]) -> None:
        """Validate one record and keep it (see the module doc), filling ``base``
        (run_id, attempt, rank from the file header) where the record has none; else
        append the reason to :attr:`rejected`."""
        name = record.get("t")
        if name not in ACCEPTED_TABLES:
            self.rejected.append(f"unknown table {name!r:.60}")
            return
        tbl = schema.TABLES[name]
        extra = (set(record) - set(tbl.column_names) - {"t"}) | (set(record) & RESERVED)
        if extra:
            self.rejected.append(f"{name}: unknown columns {sorted(extra)}"[:200])
            return
        row: dict[str, Any] = {}
        for col, ch_type in tbl.columns:
            if col in RESERVED:
                continue
            value = record.get(col)
            if value is None and col in base:
                value = base[col]
            try:
                row[col] = coerce(value, ch_type)
            except (TypeError, ValueError) as e:
                self.rejected.append(f"{name}.{col}: {e}")
                return
        self.rows.setdefault(name, []).append(row)

    @property
    def count(self) -> int:
        """Accepted rows across tables."""
        return sum(len(v) for v in self.rows.values())

    def tables(self) -> dict[str, pa.Table]:
        """One Arrow table per table name, typed by :func:`record_schema`."""
        out = {}
        for name, rows in self.rows.items():
            arrow = record_schema(name)
            columns = [_array([r[f.name] for r in rows], f.type) for f in arrow]
            out[name] = pa.Table.from_arrays(columns, schema=arrow)
        return out


def _array(values: list, arrow_type: pa.DataType) -> pa.Array:
    """``values`` as an Arrow array of ``arrow_type`` (floats keep NaN)."""
    if pa.types.is_floating(arrow_type):
        return pa.array(np.asarray(values, dtype=np.float64), arrow_type)
    return pa.array(values, arrow_type)
