"""``import_paths``: artifacts of a job that was never hooked -> one run in the store."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from ranksight.collectors.base import frame
from ranksight.store import Store, StoreError
from ranksight.store.fit import fit

from . import sources
from .formats import FORMATS, Format
from .rows import Rows, rank_from_path

if TYPE_CHECKING:  # the line readers load on use (formats/log.py)
    from . import logs

_BYTES_PER_ROW = 600
"""Rough memory of one buffered row (a dict of ~15 fields), for the flush threshold."""
_INSERT_ROWS = 500_000


@dataclass(kw_only=True, slots=True)
class ImportConfig:
    """How to import."""

    run_id: str | None = None
    """Run to file the artifacts under; None: ``import-<hash of the inputs>``. Importing
    into an existing run adds to it (several kinds of artifact of one job)."""
    attempt: int = 0
    memory_mb: int = 512
    """Memory budget (MiB) for rows held before they are written and for trace read
    buffers (Kineto traces are read in chunks of a sixteenth of it, 1-64 MiB)."""
    host: str = ""
    """Host name put on rows whose artifact does not say (default: none, "")."""

    def __post_init__(self) -> None:
        if self.memory_mb < 16:
            raise ValueError(f"memory_mb must be >= 16, got {self.memory_mb}")
        if self.attempt < 0:
            raise ValueError(f"attempt must be >= 0, got {self.attempt}")

    @property
    def chunk_bytes(self) -> int:
        """Read chunk of streamed traces (bytes)."""
        return max(1 << 20, min(64 << 20, (self.memory_mb << 20) // 16))

    @property
    def file_bytes(self) -> int:
        """Most bytes (decompressed) of a file read whole (Flight Recorder and py-spy
        dumps): a 32nd of the budget, as parsing a dump takes about 25 times its size;
        16 MiB at the default 512."""
        return (self.memory_mb << 20) // 32

    @property
    def limit_why(self) -> str:
        """Where :attr:`file_bytes` comes from, for messages."""
        return f"a 32nd of --memory-mb {self.memory_mb}"

    @property
    def max_rows(self) -> int:
        """Rows held before a flush to the store."""
        return max(10_000, (self.memory_mb << 20) // 4 // _BYTES_PER_ROW)


@dataclass
class FileResult:
    """What became of one input file."""

    path: str
    kind: str | None
    ok: bool
    message: str
    rank: int | None = None


@dataclass
class ImportResult:
    """The run written and every file's outcome."""

    run_id: str
    attempt: int
    files: list[FileResult] = field(default_factory=list)
    rows: dict[str, int] = field(default_factory=dict)
    meta: dict = field(default_factory=dict)

    @property
    def imported(self) -> list[FileResult]:
        """Files whose content went into the run."""
        return [f for f in self.files if f.ok and f.kind]

    def refuse(self, name: str, why: str) -> None:
        """Mark the file ``name`` as not imported after all (its rows failed to build once
        every file was read), saying ``why``."""
        for f in self.files:
            if f.path == name and f.ok:
                f.ok, f.message = False, why

    @property
    def failed(self) -> list[FileResult]:
        """Files that were meant as artifacts but could not be read."""
        return [f for f in self.files if not f.ok]


def default_run_id(paths: list[str]) -> str:
    """``import-`` and 10 hex digits of the absolute input paths."""
    joined = "\n".join(sorted(os.path.abspath(p) for p in paths))
    digest = hashlib.sha1(joined.encode("utf-8", "surrogateescape"))  # any name the OS gives
    return f"import-{digest.hexdigest()[:10]}"


class _Writer:
    def __init__(self, store: Store, run_id: str, attempt: int) -> None:
        self.store, self.run_id, self.attempt = store, run_id, attempt
        self.counts: dict[str, int] = {}

    def write(self, rows: Rows) -> None:
        for table, items in rows.tables.items():
            if table == "ranks" or not items:
                continue
            for i in range(0, len(items), _INSERT_ROWS):
                part = [
                    {**r, "run_id": self.run_id, "attempt": self.attempt}
                    for r in fit(table, items[i : i + _INSERT_ROWS])
                ]
                self.store.insert(table, frame(table, part))
            self.counts[table] = self.counts.get(table, 0) + len(items)
        rows.tables = {"ranks": rows.tables.get("ranks", [])}


def import_paths(
    store: Store,
    paths: list[str],
    config: ImportConfig | None = None,
    on_progress: Callable[[int, int, str], None] | None = None,
) -> ImportResult:
    """Import every artifact under ``paths`` into one run of ``store``.

    Each file is read on its own: one that is truncated, of an unknown version or not what
    it seems gives a :class:`FileResult` saying so (``ok`` False, or ``ok`` with the problem
    in the message when part of it was kept), and the others are imported.
    ``on_progress(done_bytes, total_bytes, path)`` is told as input is read.
    No run row is written when no file could be imported (``result.imported`` empty).
    Raises FileNotFoundError for a path that does not exist, :class:`HookedRun` (a
    StoreError) for a ``run_id`` of the store's that hooks recorded, StoreError if the
    store fails (rows written before stay)."""
    cfg = config or ImportConfig()
    run_id = cfg.run_id or default_run_id(paths)
    if cfg.run_id:
        _refuse_hooked(store, run_id, cfg.attempt)
    started = time.time_ns()
    with tempfile.TemporaryDirectory(prefix="ranksight-import-") as tmp:
        own = getattr(store, "folder", None)  # a chdb store's folder: never an input
        found = sources.find(paths, tmp, skip=[str(own)] if own else [])
        result = ImportResult(run_id, cfg.attempt)
        state = ImportState(cfg, _Writer(store, run_id, cfg.attempt), started, on_progress)
        state.tmp = tmp
        state.total = sum(os.path.getsize(a.path) for a in found if a.kind)
        state.hold_fr = any(a.kind == "kineto" for a in found)
        for art in found:
            result.files.append(state.take(art))
        state.finish(result)
    result.rows = state.writer.counts
    if result.imported:  # nothing read: no run (an empty one would be listed as finished)
        _write_run(store, result, state, started)
    return result


class ImportState:
    """What an import holds while it runs: the rows not yet written, every format's
    reader (``formats.FORMATS``), and what the run row needs."""

    def __init__(self, cfg: ImportConfig, writer: _Writer, ts_ns: int, on_progress) -> None:
        self.cfg, self.writer, self.ts_ns, self.on_progress = cfg, writer, ts_ns, on_progress
        self.rows = Rows()
        self.log_events: list[logs.Event] = []
        """What the text logs and py-spy dumps said (``log_events`` rows, :mod:`.logs`)."""
        self.silent_logs: list[logs.Event] = []
        """Presence of ranks whose text said nothing else: kept when other logs speak."""
        self.shown = ""
        """How messages name the file being read."""
        self.hold_fr = True
        """Whether the import holds profiler traces: else Flight Recorder rows go out with
        the rest, within the memory budget (thousands of dumps of a big job's hang)."""
        self.partial: dict[int, str] = {}
        """rank -> why its Flight Recorder dump tells nothing of its progress (damaged)."""
        self.mesh: dict = {}
        self.kinds: set[str] = set()
        self.seen: dict[tuple[str, int], str] = {}
        self.marks: dict[str, int] = {}
        self.held = (0, 0)
        """Events held (text logs, py-spy) before the file being read."""
        self.done = 0
        self.total = 0
        self.ranks: dict[int, dict] = {}
        self.fault_lines = 0
        """Log lines that say the job failed (a timeout, a failed rank, a GPU error)."""
        self.tmp = tempfile.gettempdir()
        """Folder for spilled trace data (the import's temporary folder)."""
        self.world = 0
        self.readers = {f.kind: f(self) for f in FORMATS}

    def format(self, kind: str) -> Format:
        """This import's reader of ``kind``."""
        return self.readers[kind]

    def progress(self, n: int, path: str) -> None:
        """``n`` more bytes of ``path`` read."""
        self.done += n
        if self.on_progress:
            self.on_progress(self.done, self.total, path)

    def take(self, art: sources.Artifact) -> FileResult:
        """Read one artifact with its format's reader; what became of it."""
        if art.kind is None:
            return FileResult(art.name, None, not art.named, f"skipped: {art.why}")
        reader = self.format(art.kind)
        rank = rank_from_path(art.path)
        size = os.path.getsize(art.path)
        self.marks = {t: len(r) for t, r in self.rows.tables.items()}
        self.held = (len(self.log_events), len(self.silent_logs))
        self.shown = art.name
        reader.mark()
        try:
            message, rank = reader.read(art.path, rank)
            if rank is not None and reader.one_per_rank:
                first = self.seen.setdefault((art.kind, rank), art.name)
                if first != art.name:
                    raise ValueError(
                        f"rank {rank} was already imported from {first}: a second {art.kind} "
                        "file of one rank (another job? import it under its own --run)"
                    )
        except StoreError:
            raise
        except (ValueError, OSError, EOFError) as exc:
            self._drop_last(reader)
            self.progress(size if art.kind != "kineto" else 0, art.path)
            why = str(exc).replace(f"{art.path}: ", "")  # the line names the file already
            return FileResult(art.name, art.kind, False, f"{art.kind}: {why}", rank)
        except Exception as exc:  # noqa: BLE001 - a bad file is named and skipped, never fatal
            self._drop_last(reader)
            self.progress(size if art.kind != "kineto" else 0, art.path)
            why = f"cannot be read ({type(exc).__name__}: {exc})"
            return FileResult(art.name, art.kind, False, f"{art.kind}: {why}", rank)
        if art.kind != "kineto":
            self.progress(size, art.path)
        if message.startswith("skipped: "):
            return FileResult(art.name, None, True, message, rank)
        self.kinds.add(art.kind)
        self.flush_if_full()
        return FileResult(art.name, art.kind, True, message, rank)

    def _drop_last(self, reader: Format) -> None:
        """Forget what the file just read added (a duplicate rank, a reader's error)."""
        for t, rows in self.rows.tables.items():
            del rows[self.marks.get(t, 0) :]
        del self.log_events[self.held[0] :]
        del self.silent_logs[self.held[1] :]
        reader.forget_last()

    def flush_if_full(self) -> None:
        """Write the rows held once they pass the memory budget."""
        if self.rows.count() > self.cfg.max_rows:
            self._flush()

    def _flush(self) -> None:
        for r in self.rows.tables.get("ranks", []):
            self._merge_rank(r)
        self.rows.tables["ranks"] = []
        self.writer.write(self.rows)

    def _merge_rank(self, row: dict) -> None:
        have = self.ranks.setdefault(row["rank"], {"dp": -1, "tp": -1, "pp": -1})
        for k, v in row.items():
            unknown = (None, "", -1) if k in ("dp", "tp", "pp") else (None, "", -1, 0)
            if v not in unknown or k not in have:
                have[k] = v

    def finish(self, result: ImportResult) -> None:
        """Every format's finish, then the rows left and one ``ranks`` row per rank."""
        for reader in self.readers.values():
            reader.finish(result)
        self._flush()
        rows = [{**r, "rank": k} for k, r in sorted(self.ranks.items()) if k >= 0]
        world = max([r.get("world_size", 0) or 0 for r in rows] + [len(rows)], default=0)
        for r in rows:
            r.setdefault("host", self.cfg.host)
            r["world_size"] = r.get("world_size") or world
        self.writer.write(Rows({"steps": []}))
        if rows:
            self.writer.store.insert(
                "ranks",
                frame(
                    "ranks",
                    [
                        {**r, "run_id": self.writer.run_id, "attempt": self.writer.attempt}
                        for r in fit("ranks", rows)
                    ],
                ),
            )
            self.writer.counts["ranks"] = len(rows)
        self.world = max(world, int(self.mesh.get("world_size", 0)))


class HookedRun(StoreError):
    """The run an import was asked to add to was recorded by hooks, not imported."""


def _refuse_hooked(store: Store, run_id: str, attempt: int) -> None:
    """Raise :class:`HookedRun` if ``run_id``'s ``attempt`` is in ``store`` and was not
    made by an import: artifacts of another job (or a second copy of this one's) filed
    under a hooked run would mix with its steps and change its status for good; adding to
    an imported run (a job's dumps, then its logs) stays allowed."""
    try:
        rows = store.query(
            "SELECT meta_json FROM runs WHERE run_id = %(r)s AND attempt = %(a)s",
            {"r": run_id, "a": attempt},
        )
    except StoreError:  # no runs table yet: nothing to add to
        return
    for meta in rows.get("meta_json", []):
        try:
            source = json.loads(meta or "{}").get("source", "")
        except ValueError:
            source = ""
        if source != "import":
            raise HookedRun(
                f"run {run_id!r} attempt {attempt} in {store.url} was recorded by ranksight's "
                "hooks, not imported: importing into it would mix these artifacts with its "
                "records and change its status; give another --run (or --attempt)"
            )


def _write_run(store: Store, result: ImportResult, state: ImportState, started: int) -> None:
    # The run failed where its logs show a fault (a watchdog timeout, a failed rank, a GPU
    # error: logs.FAULT_KINDS); dumps and stacks alone may come from a healthy job. A hang
    # is the analyzer's finding either way (the Runs page shows a run with one as hung).
    failed = state.fault_lines > 0
    mesh = state.mesh
    result.meta.update(
        source="import",
        host=socket.gethostname(),
        inputs=[asdict(f) for f in result.files],
        partial_ranks={str(r): why for r, why in sorted(state.partial.items())},
        kinds=sorted(state.kinds),
    )
    row = {
        "run_id": result.run_id, "attempt": result.attempt, "created_ns": started,
        "updated_ns": time.time_ns(), "status": "failed" if failed else "finished",
        "world_size": state.world, "dp": mesh.get("dp", 0), "tp": mesh.get("tp", 0),
        "pp": mesh.get("pp", 0), "meta_json": json.dumps(result.meta, default=str),
    }  # fmt: skip
    store.insert("runs", frame("runs", fit("runs", [row])))
