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

:func:`read_dump` never raises for a bad dump: an empty, truncated or foreign file, or an
unknown version, gives what could be read plus ``problems`` saying what could not. Pickles
are loaded with an unpickler that refuses every class (dumps hold only plain data).
"""

from __future__ import annotations

import gzip
import io
import json
import math
import os
import pickle
import re
import zlib
from dataclasses import dataclass
from typing import Any

from ranksight.words import counted

KNOWN_VERSIONS = tuple(f"2.{m}" for m in range(0, 11))
"""Schema versions whose key names this reader knows (torch's ``version_val``)."""

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
    (``nccl_trace_rank_3`` -> 3, ``train_rank1.json.gz`` -> 1), else None."""
    name = os.path.basename(path)
    while (stem := _SUFFIX.sub("", name)) != name:
        name = stem
    m = _TRAILING_INT.search(name)
    return int(m.group(1)) if m else None


def read_dump(path: str, rank: int | None = None) -> FrDump:
    """Read the dump at ``path`` (see the module doc); a file that cannot be opened gives
    a dump with no entries and the reason in ``problems``."""
    if rank is None:
        rank = rank_from_name(path)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        return FrDump(path, "", "", "", rank, (), {}, {}, (f"cannot read the file: {exc}",))
    return parse(data, source=path, rank=rank)


def parse(data: bytes, source: str = "", rank: int | None = None) -> FrDump:
    """A dump from its bytes (pickle if it starts with the pickle protocol byte, JSON if
    with ``{``; either may be gzip-compressed)."""
    problems: list[str] = []
    if data[:2] == b"\x1f\x8b":  # gzip, as dumps are often kept
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as exc:
            problems.append(f"the gzip file is damaged ({exc}); read what it gave")
            data = _gunzip_partial(data)
    if not data.strip():
        return FrDump(source, "", "", "", rank, (), {}, {}, ("the file is empty",))
    if data[:1] == b"\x80":
        fmt, top, raw_entries = "pickle", *_load_pickle(data, problems)
    elif data.lstrip()[:1] == b"{":
        fmt, top, raw_entries = "json", *_load_json(data, problems)
    else:
        return FrDump(
            source,
            "",
            "",
            "",
            rank,
            (),
            {},
            {},
            ("not a Flight Recorder dump (neither pickle nor JSON)",),
        )
    version = str(top.get("version", ""))
    if not version:
        problems.append("no schema version in the dump")
    elif version not in KNOWN_VERSIONS:
        problems.append(
            f"unknown schema version {version!r} (known: 2.0-2.10): read with the 2.x key names"
        )
    entries = []
    dropped = 0
    for raw in raw_entries:
        entry = normalize_entry(raw)
        if entry is None:
            dropped += 1
        else:
            entries.append(entry)
    if dropped:
        problems.append(
            f"skipped {counted(dropped, 'entry', 'entries')} lacking {'/'.join(_REQUIRED)}"
        )
    comm = top.get("comm_lib_version", top.get("nccl_version", ""))
    return FrDump(
        source,
        fmt,
        version,
        str(comm or ""),
        rank,
        tuple(entries),
        _dict(top.get("pg_config")),
        _dict(top.get("pg_status")),
        tuple(problems),
    )


def _gunzip_partial(data: bytes) -> bytes:
    """What a damaged gzip stream decompresses to before the damage."""
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        return d.decompress(data)
    except zlib.error:
        return b""


def _dict(value: Any) -> dict:
    return value if isinstance(value, dict) else {}


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
                entries.extend(e for e in item["entries"] if isinstance(e, dict))
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
    """One entry in the ``fr_entries`` shape (without run/rank/host/source), or None if
    it lacks ``record_id``, ``profiling_name`` or ``time_created_ns``."""
    if any(raw.get(k) is None for k in _REQUIRED):
        return None
    op = str(raw["profiling_name"])
    pg = raw.get("process_group") or ("", "")
    pg_name, pg_desc = (
        (pg[0], pg[1]) if isinstance(pg, (list, tuple)) and len(pg) >= 2 else (str(pg), "")
    )
    seq = raw.get("collective_seq_id", raw.get("seq_id", -1))
    is_p2p = raw.get("is_p2p")
    if is_p2p is None:
        kind = op.split(":", 1)[-1].split(" ")[0]
        is_p2p = kind in ("send", "recv")
    duration = raw.get("duration_ms")
    return {
        "record_id": int(raw["record_id"]),
        "pg_id": _int(raw.get("pg_id"), -1),
        "pg_name": str(pg_name),
        "pg_desc": str(pg_desc),
        "collective_seq_id": _int(seq, -1),
        "p2p_seq_id": _int(raw.get("p2p_seq_id"), -1),
        "op_id": _int(raw.get("op_id"), -1),
        "op": op,
        "is_p2p": int(bool(is_p2p)),
        "input_sizes": json.dumps(raw.get("input_sizes") or []),
        "input_dtypes": json.dumps(raw.get("input_dtypes") or []),
        "output_sizes": json.dumps(raw.get("output_sizes") or []),
        "output_dtypes": json.dumps(raw.get("output_dtypes") or []),
        "state": str(raw.get("state") or ""),
        "time_created_ns": int(raw["time_created_ns"]),
        "time_started_ns": _int(raw.get("time_discovered_started_ns"), 0),
        "time_completed_ns": _int(raw.get("time_discovered_completed_ns"), 0),
        "duration_ms": float(duration) if isinstance(duration, (int, float)) else math.nan,
        "timeout_ms": _int(raw.get("timeout_ms"), 0),
        "retired": int(bool(raw.get("retired"))),
        "thread_name": str(raw.get("thread_name") or ""),
        "frames": json.dumps(
            [
                [f.get("name"), f.get("filename"), f.get("line")]
                for f in raw.get("frames") or []
                if isinstance(f, dict)
            ]
        ),
    }


def _int(value: Any, default: int) -> int:
    try:
        return int(value) if value is not None else default
    except (TypeError, ValueError):
        return default
