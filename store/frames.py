"""Turn a writer's DataFrame into a table's exact columns, and query results into frames."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import pyarrow as pa

from ranksight.store.schema import Table
from ranksight.store.types import arrow_type, table_schema


def conform(table: Table, frame: pd.DataFrame) -> pa.Table:
    """``frame``'s rows as an Arrow table with exactly ``table``'s columns, in order, typed
    by :func:`ranksight.store.types.table_schema`.

    Missing columns are filled with 0 / ``""``. Raises ValueError naming the table and
    column for unknown columns, nulls (NaN in an integer or string column), values out of
    the column type's range, and values of the wrong kind. NaN in a Float64 column is kept
    as NaN (e.g. ``steps.loss`` on ranks without a loss).
    """
    unknown = [c for c in frame.columns if c not in table.column_names]
    if unknown:
        raise ValueError(f"table {table.name!r} has no columns {unknown}")
    schema = table_schema(table)
    arrays = [_column(table.name, frame, field, len(frame)) for field in schema]
    return pa.Table.from_arrays(arrays, schema=schema)


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
