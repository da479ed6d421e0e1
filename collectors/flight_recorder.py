"""Read PyTorch Flight Recorder dumps: pickle or JSON, any 2.x schema, whole or damaged.

The Flight Recorder (``TORCH_NCCL_TRACE_BUFFER_SIZE`` / ``TORCH_FR_BUFFER_SIZE``) keeps the
last N collectives of every process group of a rank; torch writes it on a watchdog
timeout (``TORCH_NCCL_DUMP_ON_TIMEOUT``, to ``$TORCH_NCCL_DEBUG_INFO_TEMP_FILE<rank>``) or
when asked (``torch._C._distributed_c10d._dump_nccl_trace()`` / ``_dump_fr_trace()``, and
their ``_json`` forms). The dump is ``{"version", "pg_config", "pg_status", "entries",
"comm_lib_version"}`` (``nccl_version`` up to schema 2.9); each entry carries its process
group, sequence ids, op (``profiling_name``), sizes, dtypes, state, times and frames. Key
names differ between versions (``seq_id`` before ``collective_seq_id``; ``thread_name``,
``is_p2p``, ``timeout_ms`` and dtypes appear over time); :func:`normalize_entry` maps them
all to one shape.

:func:`read_dump` never raises for a bad dump: an empty, truncated or foreign file, an
unknown version, or values of the wrong type give what could be read plus ``problems``
saying what could not; every value of an entry is of its ``fr_entries`` column's type
(:mod:`ranksight.store.fit`). Pickles are loaded with an unpickler that refuses every class
(dumps hold only plain data). What a dump may take is bounded: :data:`DUMP_BYTES`
decompressed (``ranksight import`` derives its own limit from ``--memory-mb``), and one
entry per :data:`BYTES_PER_ENTRY` of it (a pickle's shared references could otherwise
build millions of entries from a few bytes).
"""

from __future__ import annotations

import io
import json
import math
import os
import pickle
import re
from dataclasses import dataclass
from typing import Any

from ranksight.ground.words import counted
from ranksight.store.fit import fit_int, fit_rank

from .bounded import TooBig, inflate, read_bytes

KNOWN_VERSIONS = tuple(f"2.{m}" for m in range(0, 11))
"""Schema versions whose key names this reader knows (torch's ``version_val``)."""

DUMP_BYTES = 8 << 20
"""Most bytes (decompressed) of one dump the node agent reads (8 MiB): a real dump of
2,000 entries with stacks is 0.3 MB; parsing takes about 25 times a dump's size."""
BYTES_PER_ENTRY = 64
"""A real dump's pickle spends 130-560 bytes an entry; entries past one per this many
bytes of the dump are not read (and said so)."""
_REQUIRED = ("record_id", "profiling_name", "time_created_ns")
_TRAILING_INT = re.compile(r"(\d+)$")
_SUFFIX = re.compile(r"\.(gz|pkl|pickle|json)$")


@dataclass(frozen=True, slots=True)
class FrDump:
    """What could be read from one dump."""

    source: str
    format: str
    """``pickle``, ``json`` or "" (unrecognized)."""
    version: str
    comm_lib_version: str
    rank: int | None
    """From the caller, else the file name's trailing number, else None."""
    entries: tuple[dict, ...]
    """Normalized entries (:func:`normalize_entry`), in dump order."""
    pg_config: dict
    pg_status: dict
    problems: tuple[str, ...]
    """What could not be read, one sentence each; empty for a clean dump."""


class _PlainUnpickler(pickle.Unpickler):
    """Refuses every global: a Flight Recorder dump holds only dicts, lists and scalars."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refused to load {module}.{name}: not plain data")


class _SalvagingUnpickler(pickle._Unpickler):  # the pure-Python one keeps its stacks
    find_class = _PlainUnpickler.find_class


def rank_from_name(path: str) -> int | None:
    """The trailing number of a dump's file name, past ``.pkl``/``.json``/``.gz``
    (``nccl_trace_rank_3`` -> 3, ``train_rank1.json.gz`` -> 1), else None (also for a
    number no rank can be: 2**31 and past, :func:`~ranksight.store.fit.fit_rank`)."""
    name = os.path.basename(path)
    while (stem := _SUFFIX.sub("", name)) != name:
        name = stem
    m = _TRAILING_INT.search(name)
    return fit_rank(m.group(1)) if m else None


def read_dump(path: str, rank: int | None = None, limit: int = DUMP_BYTES, why: str = "") -> FrDump:
    """Read the dump at ``path`` (see the module doc), at most ``limit`` bytes of it
    decompressed (``why``: where the limit comes from, for the message); a file that
    cannot be opened or passes the limit gives a dump with no entries and the reason in
    ``problems``."""
    if rank is None:
        rank = rank_from_name(path)
    try:
        data, damage = read_bytes(path, limit, why)
    except (OSError, TooBig) as exc:
        what = str(exc) if isinstance(exc, TooBig) else f"cannot read the file: {exc}"
        return FrDump(path, "", "", "", rank, (), {}, {}, (what,))
    return parse(data, source=path, rank=rank, damage=damage)


def parse(
    data: bytes,
    source: str = "",
    rank: int | None = None,
    damage: str = "",
    limit: int = DUMP_BYTES,
) -> FrDump:
    """A dump from its bytes (pickle if it starts with the pickle protocol byte, JSON if
    with ``{``; either may be gzip-compressed, inflated up to ``limit`` bytes); ``damage``:
    what cut the file's gzip stream short, if anything."""
    problems: list[str] = []
    try:
        data, cut = inflate(data, limit, source)
    except TooBig as exc:
        return FrDump(source, "", "", "", rank, (), {}, {}, (str(exc),))
    damage = damage or cut
    if damage:
        problems.append(f"{damage}; read what it gave")
    if not data.strip():
        return FrDump(source, "", "", "", rank, (), {}, {}, (*problems, "the file is empty"))
    if data[:1] == b"\x80":
        fmt, top, raw_entries = "pickle", *_load_pickle(data, problems)
    elif data.lstrip()[:1] == b"{":
        fmt, top, raw_entries = "json", *_load_json(data, problems)
    else:
        return FrDump(source, "", "", "", rank, (), {}, {},
                      ("not a Flight Recorder dump (neither pickle nor JSON)",))  # fmt: skip
    version = _text(top.get("version", ""))
    if not version:
        problems.append("no schema version in the dump")
    elif version not in KNOWN_VERSIONS:
        problems.append(
            f"unknown schema version {version!r} (known: 2.0-2.10): read with the 2.x key names"
        )
    most = max(1, len(data) // BYTES_PER_ENTRY)
    if len(raw_entries) > most:
        problems.append(
            f"{counted(len(raw_entries), 'entry', 'entries')} in {counted(len(data), 'byte', spec=',')}"
            f" (shared references): read the first {most:,}"
        )
        raw_entries = raw_entries[:most]
    entries = [e for e in map(normalize_entry, raw_entries) if e is not None]
    if len(entries) < len(raw_entries):
        dropped = len(raw_entries) - len(entries)
        problems.append(
            f"skipped {counted(dropped, 'entry', 'entries')} lacking {'/'.join(_REQUIRED)}"
        )
    pg_config, pg_status = (
        _groups(top.get("pg_config"), problems, "pg_config"),
        _groups(top.get("pg_status"), problems, "pg_status"),
    )
    comm = top.get("comm_lib_version", top.get("nccl_version", ""))
    return FrDump(source, fmt, version, _text(comm or ""), rank, tuple(entries), pg_config,
                  pg_status, tuple(problems))  # fmt: skip


def _text(value: Any) -> str:
    """A dump's text field (a version, a name) as text, whatever its type."""
    return value if isinstance(value, str) else str(value)


def _groups(value: Any, problems: list[str], key: str) -> dict:
    """``pg_config``/``pg_status``: process group -> dict; a group whose value is no dict
    is left out (and said so)."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        problems.append(f"{key} is no mapping ({type(value).__name__}): left out")
        return {}
    out = {_text(k): v for k, v in value.items() if isinstance(v, dict)}
    if len(out) < len(value):
        problems.append(f"{key}: {counted(len(value) - len(out), 'group')} of no mapping left out")
    return out


def _load_pickle(data: bytes, problems: list[str]) -> tuple[dict, list]:
    """(top-level dict, raw entries) of a pickle, salvaging a truncated one."""
    try:
        top = _PlainUnpickler(io.BytesIO(data)).load()
    except Exception as exc:  # noqa: BLE001 - any damage: salvage what was built
        return _salvage_pickle(data, problems, exc)
    if not isinstance(top, dict) or "entries" not in top:
        problems.append("not a Flight Recorder dump (no 'entries' in the pickle)")
        return (top if isinstance(top, dict) else {}), []
    entries = top.get("entries")
    return top, [e for e in entries if isinstance(e, dict)] if isinstance(entries, list) else []


def _salvage_pickle(data: bytes, problems: list[str], exc: Exception) -> tuple[dict, list]:
    """Entries and top-level fields already built when a damaged pickle stopped loading.

    The pure-Python unpickler keeps its stack and mark stack; finished entry dicts wait
    there for the list's APPENDS, and the top-level keys and values for the dict's
    SETITEMS (torch's pickler writes ``EMPTY_DICT MARK k v ... SETITEMS``)."""
    unpickler = _SalvagingUnpickler(io.BytesIO(data))
    try:
        unpickler.load()
    except Exception:  # noqa: BLE001 - expected: the same damage
        pass
    frames = [*getattr(unpickler, "metastack", []), getattr(unpickler, "stack", [])]
    top: dict = {}
    entries: list = []
    for frame in frames:
        for i, item in enumerate(frame):
            if isinstance(item, dict) and "profiling_name" in item:
                entries.append(item)
            elif isinstance(item, str) and i + 1 < len(frame) and item in _TOP_KEYS:
                top.setdefault(item, frame[i + 1])
            elif isinstance(item, dict) and "entries" in item:
                top = {**item, **top}
                inner = item["entries"] if isinstance(item["entries"], list) else []
                entries.extend(e for e in inner if isinstance(e, dict))
    problems.append(
        f"the pickle is damaged ({type(exc).__name__}: {exc}); kept {len(entries)} complete entries"
    )
    return top, entries


_TOP_KEYS = {"version", "pg_config", "pg_status", "comm_lib_version", "nccl_version"}


def _load_json(data: bytes, problems: list[str]) -> tuple[dict, list]:
    """(top-level dict, raw entries) of a JSON dump, salvaging a truncated one entry by
    entry."""
    text = data.decode(errors="replace")
    try:
        top = json.loads(text)
    except ValueError as exc:
        return _salvage_json(text, problems, exc)
    if not isinstance(top, dict) or "entries" not in top:
        problems.append("not a Flight Recorder dump (no 'entries' in the JSON)")
        return (top if isinstance(top, dict) else {}), []
    entries = top.get("entries")
    return top, [e for e in entries if isinstance(e, dict)] if isinstance(entries, list) else []


def _salvage_json(text: str, problems: list[str], exc: Exception) -> tuple[dict, list]:
    """Top-level scalars by pattern and every entry object that decodes whole."""
    top: dict = {}
    for key in ("version", "comm_lib_version", "nccl_version"):
        m = re.search(rf'"{key}"\s*:\s*"([^"]*)"', text)
        if m:
            top[key] = m.group(1)
    entries, decoder = [], json.JSONDecoder()
    start = re.search(r'"entries"\s*:\s*\[', text)
    pos = start.end() if start else len(text)
    while pos < len(text):
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        try:
            obj, pos = decoder.raw_decode(text, pos)
        except ValueError:
            break
        if isinstance(obj, dict):
            entries.append(obj)
    problems.append(f"the JSON is damaged ({exc}); kept {len(entries)} complete entries")
    return top, entries


def normalize_entry(raw: dict) -> dict | None:
    """One entry in the ``fr_entries`` shape (without run/rank/host/source), every value of
    its column's type (a number past it, or of no number, unknown: -1, times 0); None if
    it lacks ``record_id``, ``profiling_name`` or ``time_created_ns``."""
    if any(raw.get(k) is None for k in _REQUIRED):
        return None
    record, created = _int(raw["record_id"], -1), _int(raw["time_created_ns"], 0)
    op = _text(raw["profiling_name"])
    pg = raw.get("process_group") or ("", "")
    pg_name, pg_desc = (
        (pg[0], pg[1]) if isinstance(pg, (list, tuple)) and len(pg) >= 2 else (pg, "")
    )
    seq = raw.get("collective_seq_id", raw.get("seq_id", -1))
    is_p2p = raw.get("is_p2p")
    if is_p2p is None:
        kind = op.split(":", 1)[-1].split(" ")[0]
        is_p2p = kind in ("send", "recv")
    duration = raw.get("duration_ms")
    frames = raw.get("frames")
    return {
        "record_id": record,
        "pg_id": _int(raw.get("pg_id"), -1),
        "pg_name": _text(pg_name),
        "pg_desc": _text(pg_desc),
        "collective_seq_id": _int(seq, -1),
        "p2p_seq_id": _int(raw.get("p2p_seq_id"), -1),
        "op_id": _int(raw.get("op_id"), -1),
        "op": op,
        "is_p2p": int(bool(is_p2p)),
        "input_sizes": json.dumps(_shapes(raw.get("input_sizes"))),
        "input_dtypes": json.dumps(_names(raw.get("input_dtypes"))),
        "output_sizes": json.dumps(_shapes(raw.get("output_sizes"))),
        "output_dtypes": json.dumps(_names(raw.get("output_dtypes"))),
        "state": _text(raw.get("state") or ""),
        "time_created_ns": created,
        "time_started_ns": _int(raw.get("time_discovered_started_ns"), 0),
        "time_completed_ns": _int(raw.get("time_discovered_completed_ns"), 0),
        "duration_ms": float(duration)
        if isinstance(duration, (int, float)) and math.isfinite(float(duration))
        else math.nan,
        "timeout_ms": _int(raw.get("timeout_ms"), 0),
        "retired": int(bool(raw.get("retired"))),
        "thread_name": _text(raw.get("thread_name") or ""),
        "frames": json.dumps(
            [
                [_text(f.get("name")), _text(f.get("filename")), _int(f.get("line"), -1)]
                for f in (frames if isinstance(frames, list) else [])
                if isinstance(f, dict)
            ]
        ),  # fmt: skip
    }


def _int(value: Any, default: int) -> int:
    """``value`` as an Int64 (:func:`~ranksight.store.fit.fit_int`), ``default`` where it
    is missing or no integer (text, a list, inf)."""
    if value is None or isinstance(value, (list, tuple, dict, set)):
        return default
    if isinstance(value, float) and not value.is_integer():
        return default
    got = fit_int(value, "Int64")
    return default if got is None or (got == -1 and value not in (-1, "-1")) else got


def _shapes(value: Any) -> list[list[int]]:
    """Tensor shapes (``[[2, 3], [4]]``): a list of lists of ints; a scalar shape ``[n]``;
    a dimension that is no integer is -1."""
    if not isinstance(value, (list, tuple)):
        return []
    return [[_int(d, -1) for d in (s if isinstance(s, (list, tuple)) else [s])] for s in value]


def _names(value: Any) -> list[str]:
    """Dtype names (``["Float", "Long"]``) as a list of text."""
    return [_text(v) for v in value] if isinstance(value, (list, tuple)) else []
