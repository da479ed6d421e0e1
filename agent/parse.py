"""Parse spool records into typed Arrow tables, vectorized: binary segments' columns
(:func:`check_columns`) and JSON lines (:func:`parse_chunk`).

The hooks write binary segments (``trainer_hooks/spool_format.py``): each frame's
columns arrive as Arrow arrays over the bytes read, and :func:`check_columns` validates
them column by column with Arrow compute (unknown columns, wrong kinds, integer ranges,
string lengths) and fills what the records leave out (run_id, attempt and rank from the
segment header, else the column's default): no per-record Python work.

JSON spool files (older hooks, hand-written producers) are parsed as below.

One spool file's new complete lines are parsed at once by Arrow's JSON reader against
the union of every accepted table's columns, then split by ``"t"`` and checked column
by column with Arrow compute (unknown columns, integer ranges, string lengths), giving
the same rows and rejections as checking each record with ``agent/records.py``. A chunk
the JSON reader refuses as a whole (a truncated line, a string where a number belongs, an
unknown or reserved field, a header in the middle) is parsed line by line by
``records.py`` instead, so one bad record costs that chunk's speed, never its good rows.
A line that would break ``json.loads`` (nested too deep: ``agent/poison.py``) or whose
checks raise is a :class:`~.poison.Poison`, kept in :attr:`Parsed.quarantined`.

Measured on the 2-core test VM: about 2.5 µs of CPU per 330-byte ``collectives`` record
(Arrow's JSON reader is most of it), against about 5 µs for ``json.loads`` plus
per-record checks.
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from ranksight.store import schema

from .poison import Poison, Poisoned, loads_bounded
from .records import _INT_RANGE, ACCEPTED_TABLES, MAX_STRING, RESERVED, Batch, record_schema

HEADER_TABLE = "_header"
"""``"t"`` of a spool file's header line: ``trainer_hooks.spool.HEADER_TABLE``, repeated
here because importing ``ranksight.trainer_hooks`` imports torch (seconds of start-up)."""
_BASE = ("run_id", "attempt", "rank")


def _union_schema() -> pa.Schema:
    """Every accepted table's columns, integers as int64 (range-checked per table)."""
    fields: dict[str, pa.DataType] = {"t": pa.string()}
    for name in ACCEPTED_TABLES:
        for column, ch_type in schema.TABLES[name].columns:
            if column in RESERVED:
                continue
            if ch_type == "String":
                fields[column] = pa.string()
            elif ch_type == "Float64":
                fields[column] = pa.float64()
            elif ch_type == "UInt64":
                fields.setdefault(column, pa.uint64())
            else:
                fields[column] = pa.int64()
    return pa.schema(list(fields.items()))


UNION = _union_schema()
_PARSE = pj.ParseOptions(explicit_schema=UNION, unexpected_field_behavior="error")


@dataclass
class Parsed:
    """Accepted rows per table (Arrow, :func:`records.record_schema` types), the
    reasons records were rejected, and the input set aside because it broke decoding
    (``quarantined``, offsets into the bytes parsed). ``base`` is the file header seen
    last."""

    tables: dict[str, pa.Table] = field(default_factory=dict)
    rejected: list[str] = field(default_factory=list)
    base: dict | None = None
    quarantined: list[Poison] = field(default_factory=list)

    @property
    def count(self) -> int:
        """Accepted rows across tables."""
        return sum(t.num_rows for t in self.tables.values())

    def extend(self, other: Parsed) -> None:
        """Add ``other``'s rows and rejections to these."""
        for name, table in other.tables.items():
            have = self.tables.get(name)
            self.tables[name] = table if have is None else pa.concat_tables([have, table])
        self.rejected.extend(other.rejected)
        self.quarantined.extend(other.quarantined)

    def frames(self) -> dict:
        """The accepted rows as one pandas DataFrame per table."""
        return {name: t.to_pandas() for name, t in self.tables.items()}


def parse_chunk(data: bytes, base: dict | None, source: str = "") -> Parsed:
    """Parse complete JSON lines ``data`` of one spool file whose header (run_id,
    attempt, rank) is ``base`` (None if not seen yet: the first line must then be the
    header). ``source`` names the file in rejection reasons. Never raises: what the
    vectorized path cannot take goes line by line (:func:`parse_lines`)."""
    try:
        return _parse_table(data, base, source)
    except Exception:  # noqa: BLE001 - Arrow's errors, or a bug: each line on its own
        return parse_lines(data, base, source)


def _parse_table(data: bytes, base: dict | None, source: str) -> Parsed:
    """:func:`parse_chunk`'s vectorized path; raises on anything it does not take."""
    try:
        table = pj.read_json(io.BytesIO(data), parse_options=_PARSE)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return parse_lines(data, base, source)
    kinds = table.column("t")
    headers = pc.equal(kinds, HEADER_TABLE).fill_null(False)
    n_headers = pc.sum(headers).as_py() or 0
    if n_headers > 1 or (n_headers == 1 and not headers[0].as_py()):
        return parse_lines(data, base, source)
    if n_headers == 1:
        base = {k: table.column(k)[0].as_py() for k in _BASE if table.column(k)[0].is_valid}
        table, kinds = table.slice(1), kinds.slice(1)
    out = Parsed(base=base)
    if table.num_rows == 0:
        return out
    if base is None:
        return parse_lines(data, None, source)
    try:
        for name in pc.unique(kinds).to_pylist():
            if name in ACCEPTED_TABLES:
                _check_table(name, table.filter(pc.equal(kinds, name)), base, out)
            else:
                n = pc.sum(pc.equal(kinds, name) if name is not None else pc.is_null(kinds))
                out.rejected.extend([f"unknown table {name!r:.60}"] * n.as_py())
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
        return parse_lines(data, base, source)  # e.g. a header value of the wrong type
    return out


def parse_lines(data: bytes, base: dict | None, source: str = "") -> Parsed:
    """The line-by-line path: each line through ``json.loads`` (bounded:
    ``poison.loads_bounded``) and ``records.Batch``. Never raises: a line that would break
    decoding, or whose checks raise, is quarantined with its offset in ``data``."""
    batch, poisons = Batch(), []
    label = source.rsplit("/", 1)[-1]
    for at, raw in _lines(data):
        try:
            rec = loads_bounded(raw)
            if not isinstance(rec, dict):
                raise ValueError("not a JSON object")
        except Poisoned as e:
            poisons.append(Poison(f"{label}: {e}", raw, at))
            continue
        except ValueError as e:
            batch.rejected.append(f"{label}: malformed line ({str(e)[:80]})")
            continue
        try:
            base = _take(rec, base, batch, label)
        except Exception as e:  # noqa: BLE001 - one record's checks never stop the rest
            poisons.append(Poison(f"{label}: {type(e).__name__} checking it ({e!s:.80})", raw, at))
    try:
        tables = batch.tables()
    except Exception as e:  # noqa: BLE001 - never expected: the lines go aside, not the agent
        return Parsed(base=base, quarantined=[Poison(f"{label}: {type(e).__name__}", data, 0)])
    return Parsed(tables, batch.rejected, base, poisons)


def _lines(data: bytes):
    """``(offset, line)`` of each line of ``data``, split as ``bytes.splitlines`` does."""
    at = 0
    for line in data.splitlines(keepends=True):
        yield at, line.rstrip(b"\r\n")
        at += len(line)


def _take(rec: dict, base: dict | None, batch: Batch, label: str) -> dict | None:
    """Add record ``rec`` to ``batch`` (or take it as the header); the header after it."""
    if rec.get("t") == HEADER_TABLE:
        return {k: rec[k] for k in _BASE if k in rec}
    if base is None:
        batch.rejected.append(f"{label}: record before header")
    else:
        batch.add(rec, base)
    return base


def check_columns(name: str, rows: pa.Table, base: dict, out: Parsed) -> None:
    """Validate a binary frame's records of table ``name`` (``rows``: one column per
    record key, no nulls) into ``out``: the accepted rows typed by
    :func:`records.record_schema`, one rejection reason per rejected record. The same
    rules as :func:`parse_chunk`: an unknown table, an unknown or reserved column or a
    column of the wrong kind rejects every record; an integer out of its column type's
    range or a string over ``MAX_STRING`` characters rejects that record."""
    n = rows.num_rows
    if not n:
        return
    if name not in ACCEPTED_TABLES:
        out.rejected.extend([f"unknown table {name!r:.60}"] * n)
        return
    target = record_schema(name)
    unknown = sorted(set(rows.column_names) - set(target.names)) + sorted(
        set(rows.column_names) & RESERVED
    )
    if unknown or len(set(rows.column_names)) != len(rows.column_names):
        out.rejected.extend([f"{name}: unknown columns {unknown}"[:200]] * n)
        return
    bad = None
    for f in target:
        if f.name not in rows.column_names:
            continue
        column = rows.column(f.name)
        ch_type = schema.TABLES[name].type_of(f.name)
        if pa.types.is_string(f.type) != (
            pa.types.is_string(column.type) or pa.types.is_large_string(column.type)
        ):
            kind = "a string" if pa.types.is_string(f.type) else "a number"
            out.rejected.extend([f"{name}.{f.name}: expected {kind}, got {column.type}"] * n)
            return
        checks = [(_column_problem(column, ch_type), f"out of range for {ch_type}")]
        if pa.types.is_floating(column.type) and not pa.types.is_floating(f.type):
            fraction = pc.invert(pc.equal(pc.floor(column), column).fill_null(False))
            checks.insert(0, (fraction if pc.any(fraction).as_py() else None, "not an integer"))
        for problem, what in checks:
            if problem is None:
                continue
            problem = problem.to_numpy(zero_copy_only=False)
            if bad is not None:
                problem = problem & ~bad
            out.rejected.extend([f"{name}.{f.name}: {what}"] * int(problem.sum()))
            bad = problem if bad is None else bad | problem
    if bad is not None:
        rows = rows.filter(pa.array(~bad))
        n = rows.num_rows
        if not n:
            return
    arrays = []
    for f in target:
        if f.name in rows.column_names:
            try:
                arrays.append(rows.column(f.name).cast(f.type))
            except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
                reason = f"{name}.{f.name}: not a {f.type} ({str(exc)[:60]})"
                out.rejected.extend([reason] * n)
                return
        else:
            arrays.append(pa.repeat(pa.scalar(_fill_value(f, base), f.type), n))
    out.extend(Parsed({name: pa.Table.from_arrays(arrays, schema=target)}))


def _fill_value(f: pa.Field, base: dict):
    """What a column the records leave out takes: the header's value or the default."""
    if f.name in base:
        return base[f.name]
    if pa.types.is_string(f.type):
        return ""
    return float("nan") if pa.types.is_floating(f.type) else 0


def _check_table(name: str, rows: pa.Table, base: dict, out: Parsed) -> None:
    """Validate ``rows`` (all of table ``name``) column by column into ``out``."""
    target = record_schema(name)
    wanted = set(target.names)
    bad = pa.array([False] * rows.num_rows)
    reasons: list[tuple[pa.Array, str]] = []
    for column in rows.column_names:
        if column == "t" or column in wanted:
            continue
        valid = pc.is_valid(rows.column(column))
        if pc.any(valid).as_py():
            reasons.append((valid, f"{name}: unknown columns [{column!r}]"))
    for f in target:
        ch_type = schema.TABLES[name].type_of(f.name)
        check = _column_problem(rows.column(f.name), ch_type)
        if check is not None:
            reasons.append((check, f"{name}.{f.name}: out of range for {ch_type}"))
    for mask, reason in reasons:
        mask = pc.and_(mask, pc.invert(bad))
        out.rejected.extend([reason] * (pc.sum(mask).as_py() or 0))
        bad = pc.or_(bad, mask)
    good = rows.filter(pc.invert(bad)) if reasons else rows
    if good.num_rows:
        out.extend(Parsed({name: _typed(good, target, base)}))


def _column_problem(column: pa.ChunkedArray, ch_type: str) -> pa.ChunkedArray | None:
    """Rows whose value does not fit ``ch_type`` (None if all do). The common case, all
    fit, costs one pass over the column (its byte lengths, or its minimum and maximum)."""
    if ch_type == "String":
        longest = pc.max(pc.binary_length(column)).as_py()
        if longest is None or longest <= MAX_STRING:  # no more characters than bytes
            return None
        problem = pc.greater(pc.utf8_length(column), MAX_STRING)
    elif ch_type == "UInt64" and pa.types.is_unsigned_integer(column.type):
        return None
    elif ch_type == "UInt64":
        problem = pc.less(column, 0)
    elif ch_type in _INT_RANGE:
        low, high = _INT_RANGE[ch_type]
        if pa.types.is_integer(column.type) and column.null_count == 0:
            found = pc.min_max(column)
            if found["min"].as_py() is None or (
                low <= found["min"].as_py() and found["max"].as_py() <= high
            ):
                return None
        problem = pc.or_(pc.less(column, low), pc.greater(column, high))
    else:
        return None
    problem = problem.fill_null(False)
    return problem if pc.any(problem).as_py() else None


def _typed(rows: pa.Table, target: pa.Schema, base: dict) -> pa.Table:
    """``rows`` with ``target``'s columns and types; nulls become the header's value
    (run_id, attempt, rank) or the column's default."""
    arrays = []
    for f in target:
        column = rows.column(f.name)
        if f.name in base:
            fill = pa.scalar(base[f.name], column.type)
        elif pa.types.is_string(f.type):
            fill = pa.scalar("", pa.string())
        elif pa.types.is_floating(f.type):
            fill = pa.scalar(float("nan"), pa.float64())
        else:
            fill = pa.scalar(0, column.type)
        if column.null_count:
            column = column.fill_null(fill)
        arrays.append(column.cast(f.type))
    return pa.Table.from_arrays(arrays, schema=target)
