"""What every collector is: a reader of one signal that returns rows for its tables.

A collector is opened once (:meth:`Collector.open` raises :class:`Unavailable` when the
signal cannot be read on this node: no NVML, no sysfs counters, no py-spy), then asked for
rows every ``interval_s`` seconds by the agent's runner (``agent/collect.py``), which puts
them through a batching sink into the store. A collector never raises for a field a device
does not report: the field is empty (NaN in Float64 columns, "" in strings). Whatever a
collector's :meth:`Collector.collect` returns is made to fit its columns on the way out
(:func:`fitted`): a file's garbage that slipped past a parser never fails the insert of
every other row of its table, and is counted and logged once per column.
"""

from __future__ import annotations

import abc
import functools
import logging
import math
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import pandas as pd

from ranksight.store import schema
from ranksight.store.fit import fit

from .complaints import Complaints

Rows = dict[str, list[dict[str, Any]]]
"""Rows per table name, each row a dict of column -> value."""

EMPTY = math.nan
"""The value of a numeric field that a device or driver does not report."""


class Unavailable(RuntimeError):
    """The signal cannot be read on this node; the message says why in one line."""


@dataclass(kw_only=True, slots=True)
class NodeContext:
    """What collectors share about the node they run on."""

    host: str = field(default_factory=socket.gethostname)
    """Host name written to every row (the hooks use the same ``socket.gethostname()``)."""
    spool_dir: str = ""
    """The spool folder the local ranks write to (finds their pids); "" if none."""
    data_dir: str = "."
    """Folder whose disk space the host collector reports (the agent's data folder)."""
    sysfs_root: str = "/sys"
    """Root of sysfs; tests point it at fixture trees."""

    def __post_init__(self) -> None:
        if not self.host:
            raise ValueError("NodeContext.host must not be empty")
        if not self.sysfs_root:
            raise ValueError("NodeContext.sysfs_root must not be empty")


MISFITS = Complaints(logging.getLogger("ranksight.collectors"))
"""Values a collector returned that did not fit their column, by ``collector table.column``."""


def fitted(collector: str, rows: Rows) -> Rows:
    """``rows`` with every value made to fit its column (:func:`ranksight.store.fit.fit`);
    each value that had to change is counted in :data:`MISFITS` (logged once per column).
    Rows of tables the schema lacks are left for :func:`frame` to name."""
    if not isinstance(rows, dict):
        return rows
    out: Rows = {}
    for table, items in rows.items():
        if table not in schema.TABLES or not items:
            out[table] = items
            continue
        out[table] = made = fit(table, items)
        for before, after in zip(items, made, strict=True):
            for col, value in before.items():
                if _changed(value, after.get(col, value)):
                    MISFITS.note(
                        f"{collector} {table}.{col}",
                        f"{value!r:.60} does not fit: stored as {after[col]!r}",
                    )
    return out


def _changed(before: Any, after: Any) -> bool:
    if before is after or before is None:
        return False
    if isinstance(before, float) and math.isnan(before):
        return not (isinstance(after, float) and math.isnan(after))
    return before != after


class Collector(abc.ABC):
    """One signal. Subclasses set ``name``, ``tables`` and ``interval_s`` and implement
    :meth:`collect`; ``interval_s == 0`` means :meth:`collect` blocks by itself (an event
    wait) and is called back to back. Every subclass's :meth:`collect` returns its rows
    through :func:`fitted`."""

    name: ClassVar[str] = ""
    tables: ClassVar[tuple[str, ...]] = ()
    interval_s: float = 1.0

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        if "collect" in cls.__dict__:
            cls.collect = _fitting(cls.collect)  # type: ignore[method-assign]  # wraps each subclass's own

    def open(self) -> None:  # noqa: B027 - optional
        """Prepare to read; raise :class:`Unavailable` if the signal is not on this node."""

    @abc.abstractmethod
    def collect(self, now_ns: int) -> Rows:
        """Rows read now (``now_ns``: ``time.time_ns()``), per table."""

    def close(self) -> None:  # noqa: B027 - optional
        """Release what :meth:`open` took. Safe to call twice."""


def _fitting(collect: Callable[..., Rows]) -> Callable[..., Rows]:
    @functools.wraps(collect)
    def wrapper(self: Collector, now_ns: int) -> Rows:
        return fitted(self.name, collect(self, now_ns))

    return wrapper


def frame(table: str, rows: Iterable[dict[str, Any]]) -> pd.DataFrame:
    """``rows`` as a DataFrame with exactly ``table``'s columns, typed by the schema.

    Missing numeric fields are NaN in Float64 columns and 0 in integer columns; missing
    strings are "". Raises ValueError naming the table for an unknown table or column, or
    a value that does not fit its column type.
    """
    spec = schema.table(table)
    rows = list(rows)
    known = set(spec.column_names)
    for row in rows:
        extra = set(row) - known
        if extra:
            raise ValueError(f"table {table!r} has no columns {sorted(extra)}")
    data = {}
    for col, ch_type in spec.columns:
        data[col] = _column([r.get(col) for r in rows], ch_type, f"{table}.{col}")
    return pd.DataFrame(data)


def _column(values: list[Any], ch_type: str, where: str) -> np.ndarray:
    """One typed column of :func:`frame`."""
    try:
        if ch_type == "String":
            return np.array(["" if v is None else str(v) for v in values], dtype=object)
        if ch_type == "Float64":
            return np.array([EMPTY if v is None else float(v) for v in values], dtype=np.float64)
        dtype = np.dtype(ch_type.lower())
        return np.array([0 if v is None else int(v) for v in values], dtype=dtype)
    except (TypeError, ValueError, OverflowError) as exc:
        raise ValueError(f"{where} ({ch_type}): {exc}") from None


def merge(into: Rows, more: Rows) -> Rows:
    """Append ``more``'s rows to ``into`` (in place) and return ``into``."""
    for table, rows in more.items():
        into.setdefault(table, []).extend(rows)
    return into
