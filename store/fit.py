"""Values made to fit their column types (:mod:`ranksight.store.schema`): the one place
where what a file says (a dump, a trace, a log: any type, any size) becomes a value its
column holds, so that one bad value never fails the insert of everything else
(``ranksight import``, the node agent's Flight Recorder collector)."""

from __future__ import annotations

import math

from ranksight.store.schema import table

_INT_RANGES = {"UInt8": (0, 1 << 8), "UInt32": (0, 1 << 32), "UInt64": (0, 1 << 64),
               "Int32": (-(1 << 31), 1 << 31), "Int64": (-(1 << 63), 1 << 63)}  # fmt: skip
"""Each integer column type's range, ``[lo, hi)``."""


def fit_int(value, ch_type: str) -> int | None:
    """``value`` as an integer of the column type ``ch_type`` (``Int32``, ``UInt64``...):
    an int, bool, integral float or decimal text taken as it is; one past the type's range
    is unknown (-1) in a signed column and the type's nearest bound in an unsigned one;
    anything else (a list, inf, nan, other text) is unknown: -1 signed, 0 unsigned.
    None stays None (the column's default)."""
    lo, hi = _INT_RANGES[ch_type]
    if type(value) is int and lo <= value < hi:
        return value
    if value is None:
        return None
    try:
        v = int(value) if not isinstance(value, float) or value.is_integer() else None
    except (TypeError, ValueError, OverflowError):
        v = None
    if v is None:
        return -1 if lo < 0 else 0
    if lo <= v < hi:
        return v
    return -1 if lo < 0 else (lo if v < lo else hi - 1)


def fit_float(value) -> float:
    """``value`` as a finite float, else NaN (the store's "unknown"): inf, text, lists."""
    try:
        v = float(value)
    except (TypeError, ValueError, OverflowError):
        return math.nan
    return v if math.isfinite(v) else math.nan


def fit_text(value) -> str:
    """``value`` as valid UTF-8 text (``str()`` of a non-string; lone surrogates replaced)."""
    s = value if isinstance(value, str) else "" if value is None else str(value)
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        s = "".join("\ufffd" if "\ud800" <= c <= "\udfff" else c for c in s)
    return s


def fit(table_name: str, rows: list[dict]) -> list[dict]:
    """``rows`` of ``table_name`` with every value made to fit its column (store/schema.py):
    integers by :func:`fit_int`, floats by :func:`fit_float`, text by :func:`fit_text`, so
    that no value a file gives fails the insert of the rows of every other file. Columns
    the table lacks are left for the insert to name (a programming error)."""
    cols = [(c, t) for c, t in table(table_name).columns]
    out = []
    for r in rows:
        r = dict(r)
        for col, kind in cols:
            if col not in r:
                continue
            v = r[col]
            if kind in _INT_RANGES:
                r[col] = fit_int(v, kind)
            elif kind == "Float64":
                if type(v) is not float or not math.isfinite(v):
                    r[col] = v if type(v) is float and math.isnan(v) else fit_float(v)
            elif type(v) is not str or not v.isascii():
                r[col] = fit_text(v)
        out.append(r)
    return out


def fit_rank(value) -> int | None:
    """``value`` as a rank, ``0 <= rank < 2**31`` (ranks are ``Int32`` where unknown is
    -1), else None: a rank a file states that no column could hold is no rank."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, float) and not value.is_integer():
        return None
    try:
        got = int(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return got if 0 <= got < 1 << 31 else None
