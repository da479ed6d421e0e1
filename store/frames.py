"""Turn a writer's DataFrame into a table's exact columns, and query results into frames."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from ranksight.store.schema import Table
from ranksight.store.types import arrow_type, table_schema


def conform(table: Table, frame: pd.DataFrame | pa.Table) -> pa.Table:
    """``frame``'s rows as an Arrow table with exactly ``table``'s columns, in order, typed
    by :func:`ranksight.store.types.table_schema`.

    ``frame`` may also be an Arrow table (cast column by column, no pandas round trip).
    Missing columns are filled with 0 / ``""``. Raises ValueError naming the table and
    column for unknown columns, nulls (NaN in an integer or string column), values out of
    the column type's range, and values of the wrong kind. NaN in a Float64 column is kept
    as NaN (e.g. ``steps.loss`` on ranks without a loss).
    """
    names = frame.column_names if isinstance(frame, pa.Table) else list(frame.columns)
    unknown = [c for c in names if c not in table.column_names]
    if unknown:
        raise ValueError(f"table {table.name!r} has no columns {unknown}")
    schema = table_schema(table)
    if isinstance(frame, pa.Table):
        return _conform_arrow(table.name, frame, schema)
    arrays = [_column(table.name, frame, field, len(frame)) for field in schema]
    return pa.Table.from_arrays(arrays, schema=schema)


def _conform_arrow(name: str, data: pa.Table, schema: pa.Schema) -> pa.Table:
    """:func:`conform` for an Arrow table: safe casts (out-of-range values raise)."""
    arrays = []
    for field in schema:
        if field.name not in data.column_names:
            arrays.append(_filled(field, data.num_rows))
            continue
        column = data.column(field.name)
        if column.null_count:
            raise ValueError(f"{name}.{field.name} has {column.null_count} missing values")
        try:
            arrays.append(column.cast(field.type))
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise ValueError(f"{name}.{field.name} ({field.type}): {exc}") from None
    return pa.Table.from_arrays(arrays, schema=schema)


def _filled(field: pa.Field, rows: int) -> pa.Array:
    """A column of ``rows`` zeros / empty strings of ``field``'s type."""
    if pa.types.is_string(field.type):
        return pa.array([""] * rows, field.type)
    return pa.array(np.zeros(rows), field.type)


def _column(table: str, frame: pd.DataFrame, field: pa.Field, rows: int) -> pa.Array:
    """One column of :func:`conform`."""
    if field.name not in frame.columns:
        return pa.array(
            [""] * rows if pa.types.is_string(field.type) else np.zeros(rows), field.type
        )
    values = frame[field.name]
    try:
        if pa.types.is_floating(field.type):
            array = pa.array(values.to_numpy(dtype=np.float64), field.type)  # keeps NaN
        else:
            array = pa.array(values, field.type, from_pandas=True)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError) as exc:
        raise ValueError(f"{table}.{field.name} ({field.type}): {exc}") from None
    if array.null_count:
        raise ValueError(f"{table}.{field.name} has {array.null_count} missing values")
    return array


def frame_from_arrow(data: pa.Table) -> pd.DataFrame:
    """A query result as a DataFrame (Arrow -> pandas with default dtypes)."""
    return data.to_pandas()


def frame_from_columns(
    columns: Sequence[Sequence], names_types: Sequence[tuple[str, str]], server_tz: str = "UTC"
) -> pd.DataFrame:
    """A ClickHouse server result (columnar values plus ``(name, ClickHouse type)`` per
    column, as clickhouse-driver returns them) as the DataFrame chdb would give for it.
    ``server_tz`` is the zone the driver's naive ``DateTime`` values are in."""
    arrays = []
    values: Any
    for values, (_, ch_type) in zip(columns, names_types, strict=True):
        arrow = arrow_type(ch_type)
        if ch_type == "DateTime" or ch_type.startswith("DateTime("):
            values = _epoch_s(values, server_tz)
        if isinstance(values, np.ndarray) and values.dtype.kind in "OUS":
            values = values.tolist()  # pyarrow cuts numpy "U" strings at the first NUL
        arrays.append(pa.array(values, arrow) if arrow is not None else pa.array(values))
    data = pa.Table.from_arrays(arrays, names=[name for name, _ in names_types])
    return frame_from_arrow(data)


def _epoch_s(values: Sequence, server_tz: str) -> np.ndarray:
    """Seconds since the epoch of driver ``DateTime`` values (naive ones are wall-clock
    times in ``server_tz``, as clickhouse-driver returns them)."""
    stamps = pd.DatetimeIndex(pd.to_datetime(list(values)))
    if stamps.tz is None:
        stamps = stamps.tz_localize(server_tz)
    return stamps.as_unit("s").asi8.astype(np.uint32)


def with_batch_id(
    table: str, frame: pd.DataFrame | pa.Table, batch_id: int
) -> pd.DataFrame | pa.Table:
    """``frame`` with its ``batch_id`` column set to ``batch_id`` (unchanged if 0). Raises
    ValueError if ``table`` has no such column, if ``batch_id`` is not a positive 64-bit
    value or if the frame has more than ``base.MAX_ATOMIC_ROWS`` rows."""
    from ranksight.store.base import MAX_ATOMIC_ROWS
    from ranksight.store.schema import table as table_of

    if not batch_id:
        return frame
    if "batch_id" not in table_of(table).column_names:
        raise ValueError(f"table {table!r} has no batch_id column: it cannot take a batch id")
    if not 0 < batch_id < 1 << 64:
        raise ValueError(f"batch_id must be in 1..2**64-1, got {batch_id}")
    if len(frame) > MAX_ATOMIC_ROWS:
        raise ValueError(f"{len(frame)} rows in one batch insert is over {MAX_ATOMIC_ROWS}")
    ids = np.full(len(frame), batch_id, dtype=np.uint64)
    if isinstance(frame, pa.Table):
        if "batch_id" in frame.column_names:
            frame = frame.drop_columns(["batch_id"])
        return frame.append_column("batch_id", pa.array(ids))
    return frame.assign(batch_id=ids)


def month_keys(ns: np.ndarray, tz: str) -> np.ndarray:
    """``toYYYYMM`` (e.g. 202311) of nanosecond epoch times ``ns`` in time zone ``tz``,
    as int64; the common case of one month costs two conversions, not one per row."""
    ends = pd.to_datetime([int(ns.min()), int(ns.max())], unit="ns", utc=True).tz_convert(tz)
    keys = ends.year * 100 + ends.month
    if keys[0] == keys[1]:
        return np.full(len(ns), keys[0], dtype=np.int64)
    stamps = pd.to_datetime(ns, unit="ns", utc=True).tz_convert(tz)
    return (stamps.year * 100 + stamps.month).to_numpy(dtype=np.int64)
