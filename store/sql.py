"""SQL text handling shared by the backends: parameter binding and table-name rewriting."""

from __future__ import annotations

import datetime as dt
import enum
import re
import uuid
from collections.abc import Callable, Mapping

import numpy as np


def bind(sql: str, params: Mapping | None, server_tz: str = "UTC") -> str:
    """``sql`` with each ``%(name)s`` replaced by ``params[name]`` as an escaped
    ClickHouse literal, by clickhouse-driver's rules (strings quoted with ``\\`` and ``'``
    escaped; lists become ``[..]`` arrays, tuples ``(..)`` for ``IN``; ``datetime`` values
    are rendered in ``server_tz``). With ``params=None`` the text is returned unchanged,
    so a literal ``%`` must be written ``%%`` only when params are given. Bools become
    1/0 and numpy scalars plain numbers (ClickHouse 18.16 has no ``true``).

    Raises ValueError naming a placeholder that has no value.
    """
    if params is None:
        return sql
    escaped = {key: escape_param(_plain(value), server_tz) for key, value in params.items()}
    try:
        return sql % escaped
    except KeyError as exc:
        raise ValueError(f"query parameter {exc.args[0]!r} has no value") from None
    except (TypeError, ValueError) as exc:
        raise ValueError(f"query parameters do not fit the SQL: {exc}") from None


_ESCAPES = str.maketrans(
    {"\b": "\\b", "\f": "\\f", "\r": "\\r", "\n": "\\n", "\t": "\\t", "\0": "\\0",
     "\a": "\\a", "\v": "\\v", "\\": "\\\\", "'": "\\'"}
)  # fmt: skip
"""clickhouse-driver 0.2's ``escape_chars_map`` (``clickhouse_driver/util/escape.py``)."""


def escape_param(item: object, server_tz: str = "UTC") -> object:
    """``item`` as a ClickHouse literal by clickhouse-driver 0.2's ``escape_param`` rules
    (``clickhouse_driver/util/escape.py``), without importing the driver (about 0.2 s,
    most of a small command's start): None -> ``NULL``; ``datetime`` -> ``'Y-m-d H:M:S'``
    in ``server_tz`` (an aware one converted, a naive one as it is); ``date``, ``time``,
    ``UUID`` quoted; ``str`` quoted with ``\\``, ``'`` and control characters escaped;
    ``list`` -> ``[..]``, ``tuple`` -> ``(..)``; an ``Enum`` as its value; anything else
    (numbers) as it is. ``tests/store/test_store_sql.py`` checks it against the driver's."""
    if item is None:
        return "NULL"
    if isinstance(item, dt.datetime):
        if item.tzinfo is not None:
            from zoneinfo import ZoneInfo

            item = item.astimezone(ZoneInfo(server_tz))
        return f"'{item.strftime('%Y-%m-%d %H:%M:%S')}'"
    if isinstance(item, dt.date):
        return f"'{item.strftime('%Y-%m-%d')}'"
    if isinstance(item, dt.time):
        return f"'{item.strftime('%H:%M:%S')}'"
    if isinstance(item, str):
        return f"'{item.translate(_ESCAPES)}'"
    if isinstance(item, (list, tuple)):
        inner = ", ".join(str(escape_param(x, server_tz)) for x in item)
        return f"[{inner}]" if isinstance(item, list) else f"({inner})"
    if isinstance(item, enum.Enum):
        return escape_param(item.value, server_tz)
    if isinstance(item, uuid.UUID):
        return f"'{item}'"
    return item


def _plain(value: object) -> object:
    """A parameter value as a type :func:`escape_param` renders portably."""
    if isinstance(value, (bool, np.bool_)):
        return int(value)
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(v) for v in value)
    return value


_TOKEN = re.compile(
    r"""(?P<space>\s+|--[^\n]*|/\*.*?\*/)
      | (?P<string>'(?:[^'\\]|\\.|'')*')
      | (?P<quoted>"(?:[^"\\]|\\.)*"|`(?:[^`\\]|\\.)*`)
      | (?P<word>[A-Za-z_][A-Za-z_0-9]*)
      | (?P<other>.)""",
    re.S | re.X,
)

_NOT_AN_ALIAS = frozenset(
    """WHERE PREWHERE GROUP ORDER LIMIT HAVING JOIN INNER LEFT RIGHT FULL CROSS OUTER ANY
    ALL ASOF SEMI ANTI GLOBAL ARRAY ON USING UNION SETTINGS FORMAT FINAL SAMPLE WITH INTO
    EXCEPT INTERSECT WINDOW OFFSET PASTE LOCAL""".split()
)


def _tokens(sql: str) -> list[tuple[str, str, int, int]]:
    """``(kind, text, start, end)`` for each token of ``sql`` except blanks and comments."""
    out: list[tuple[str, str, int, int]] = []
    for match in _TOKEN.finditer(sql):
        kind = match.lastgroup or ""
        if kind != "space":
            out.append((kind, match.group(), match.start(), match.end()))
    return out


def _name(token: tuple[str, str, int, int]) -> str | None:
    """The identifier a word or quoted-identifier token names, else None."""
    kind, text = token[0], token[1]
    if kind == "word":
        return text
    if kind == "quoted":
        return text[1:-1]
    return None


def rewrite_tables(sql: str, tables: Mapping[str, str] | Callable[[str], str | None]) -> str:
    """``sql`` with each bare table name right after ``FROM`` or ``JOIN`` that ``tables``
    maps (a dict, or a function returning None for names to leave alone) replaced by its
    mapping, e.g. a ``file(...)`` table function. A table without an alias keeps its name
    as one (``FROM steps`` -> ``FROM file(...) AS steps``), so ``steps.rank`` still works.
    String literals, quoted identifiers and comments are never touched; ``db.table`` and
    function calls are left alone.
    """
    lookup = tables.get if isinstance(tables, Mapping) else tables
    tokens = _tokens(sql)
    pieces, last = [], 0
    for i in range(1, len(tokens)):
        prev, token = tokens[i - 1], tokens[i]
        if prev[0] != "word" or prev[1].upper() not in ("FROM", "JOIN"):
            continue
        name = _name(token)
        replacement = lookup(name) if name is not None else None
        nxt = tokens[i + 1] if i + 1 < len(tokens) else None
        if replacement is None or (nxt is not None and nxt[1] in (".", "(")):
            continue
        has_alias = nxt is not None and (
            (nxt[0] == "word" and nxt[1].upper() not in _NOT_AN_ALIAS) or nxt[0] == "quoted"
        )
        pieces.append(sql[last : token[2]])
        pieces.append(replacement if has_alias else f"{replacement} AS {name}")
        last = token[3]
    pieces.append(sql[last:])
    return "".join(pieces)


def referenced_tables(sql: str, names: frozenset[str] | set[str]) -> set[str]:
    """Which of ``names`` appear as bare table names after ``FROM``/``JOIN`` in ``sql``."""
    found: set[str] = set()

    def note(name: str) -> str | None:
        if name in names:
            found.add(name)
        return None

    rewrite_tables(sql, note)
    return found
