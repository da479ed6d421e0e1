"""Turn spool records (dicts) into typed columnar frames of the store's tables."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from ranksight.store import schema

_NUMPY = {
    "UInt8": np.uint8,
    "UInt32": np.uint32,
    "UInt64": np.uint64,
    "Int32": np.int32,
    "Int64": np.int64,
    "Float64": np.float64,
}
_MAX_STRING = 1 << 20  # 1 MiB: a longer string is a malformed record


def column_dtype(ch_type: str) -> Any:
    """numpy dtype for a ClickHouse column type (``object`` for String)."""
    return _NUMPY.get(ch_type, object)


def _coerce(value: Any, ch_type: str) -> Any:
    if ch_type == "String":
        if not isinstance(value, str):
            raise TypeError(f"expected a string, got {type(value).__name__}")
        if len(value) > _MAX_STRING:
            raise ValueError(f"string of {len(value)} chars is over {_MAX_STRING}")
        return value
    if ch_type == "Float64":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"expected a number, got {type(value).__name__}")
        return float(value)
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and math.isfinite(value) and value == int(value):
            value = int(value)
        else:
            raise TypeError(f"expected an integer, got {value!r:.40}")
    if ch_type.startswith("UInt") and value < 0:
        raise ValueError(f"negative value {value} for {ch_type}")
    return value


@dataclass
class Batch:
    """Rows gathered per table plus rejected records with their reasons."""

    rows: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    rejected: list[str] = field(default_factory=list)

    def add(self, record: dict[str, Any], base: dict[str, Any]) -> None:
        """Validate one record against its table (``record["t"]``) and keep it, filling
        ``base`` (run_id, attempt, rank) and defaults for missing columns; a record with
        an unknown table, an unknown column or a wrong type is rejected with a reason."""
        name = record.get("t")
        if name not in schema.RECORD_TABLES and name != "runs":
            self.rejected.append(f"unknown table {name!r}")
            return
        tbl = schema.TABLES[name]
        extra = set(record) - set(tbl.column_names) - {"t"}
        if extra:
            self.rejected.append(f"{name}: unknown columns {sorted(extra)}")
            return
        row: dict[str, Any] = {}
        try:
            for col, ch_type in tbl.columns:
                if col in base and col not in record:
                    value = base[col]
                else:
                    value = record.get(col, "" if ch_type == "String" else 0)
                row[col] = _coerce(value, ch_type)
        except (TypeError, ValueError) as e:
            self.rejected.append(f"{name}.{col}: {e}")
            return
        self.rows.setdefault(name, []).append(row)

    @property
    def count(self) -> int:
        """Accepted rows across tables."""
        return sum(len(v) for v in self.rows.values())

    def frames(self) -> dict[str, pd.DataFrame]:
        """One typed DataFrame per table, columns in schema order."""
        out = {}
        for name, rows in self.rows.items():
            tbl = schema.TABLES[name]
            data = {
                col: np.array([r[col] for r in rows], dtype=column_dtype(ch_type))
                for col, ch_type in tbl.columns
            }
            out[name] = pd.DataFrame(data)
        return out
