"""Flight Recorder dumps into the store: rows from a dump, and a collector that watches
the dump folder of the node.

Each dump becomes one ``fr_dumps`` row (version, entry count, process-group config and
status, problems) and one ``fr_entries`` row per entry, every value fitting its column
(:mod:`ranksight.store.fit`: a file name that is no UTF-8 is shown with U+FFFD). The
collector takes a file once its size and mtime stayed the same across two polls (torch
writes it in one go, but a rank may die mid-write), and again whenever it changes (a rank
dumping twice); it reads at most :data:`~.flight_recorder.DUMP_BYTES` of it (a gzip
bomb is refused, named in the dump's ``problems``).

Only dumps the ranks' user wrote are read (the spool's owner rule,
``ranksight/ground/ownership.py``): a file of another uid, or one others may write, in a shared
folder such as ``/tmp`` is skipped and named once in the log (``refused``). The hooks
point torch's dumps at a private folder of the run, ``<spool>/<run_id>/a<attempt>/fr/``
(``trainer_hooks/flight_recorder.py``), where the job sets no dump path of its own; dumps
there are found without a prefix and filed under that run.
"""

from __future__ import annotations

import glob
import json
import logging
import os
import time
from dataclasses import dataclass

from ranksight.ground import env
from ranksight.ground.ownership import untrusted_file
from ranksight.store.fit import fit, fit_text

from .base import Collector, NodeContext, Rows
from .flight_recorder import FrDump, read_dump
from .local_ranks import LocalRank, scan_spool

log = logging.getLogger(__name__)

STATE_FILE = ".agent-fr-ingested.json"
"""In the spool folder: the dumps (path, size, mtime) already ingested."""
TORCH_DEFAULT_PREFIX = "/tmp/nccl_trace_rank_"
"""torch's default dump file prefix (``TORCH_NCCL_DEBUG_INFO_TEMP_FILE``)."""
PRIVATE_DIR = "fr"
"""The run's own dump folder, under ``<spool>/<run_id>/a<attempt>/``."""


def default_prefixes() -> tuple[str, ...]:
    """``$RANKSIGHT_FR_DUMP_PREFIX``, else torch's variables as set for the agent and
    torch's default, without repeats."""
    own = os.environ.get(env.FR_DUMP_PREFIX)
    if own:
        return (own,)
    found = [
        os.environ.get(env.TORCH_FR_DUMP_TEMP_FILE),
        os.environ.get(env.TORCH_NCCL_DEBUG_INFO_TEMP_FILE),
    ]
    return tuple(dict.fromkeys(p for p in [*found, TORCH_DEFAULT_PREFIX] if p))


def dump_rows(dump: FrDump, *, run_id: str, attempt: int, host: str, ts_ns: int) -> Rows:
    """``fr_dumps`` and ``fr_entries`` rows of ``dump`` (rank -1 when unknown)."""
    base = {
        "run_id": run_id,
        "attempt": attempt,
        "rank": -1 if dump.rank is None else dump.rank,
        "host": host,
    }
    head = {
        **base,
        "ts_ns": ts_ns,
        "source": dump.source,
        "format": dump.format,
        "version": dump.version,
        "comm_lib_version": dump.comm_lib_version,
        "entries": len(dump.entries),
        "pg_config_json": json.dumps(dump.pg_config, default=str),
        "pg_status_json": json.dumps(dump.pg_status, default=str),
        "problems": "\n".join(dump.problems),
    }
    entries = [{**base, "source": dump.source, **e} for e in dump.entries]
    return {"fr_dumps": fit("fr_dumps", [head]), "fr_entries": fit("fr_entries", entries)}


def owner(rank: int | None, ranks: list[LocalRank]) -> LocalRank | None:
    """The local rank ``rank`` most recently written among ``ranks`` (spool files), else None."""
    mine = [r for r in ranks if rank is not None and r.rank == rank]
    if not mine:
        return None
    return max(mine, key=lambda r: _mtime(r.spool_path))


def _mtime(path: str) -> float:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return 0.0


@dataclass(frozen=True, slots=True)
class _Seen:
    size: int
    mtime_ns: int


class FrCollector(Collector):
    """Ingests new or changed files matching ``<prefix>*`` for each prefix; a dump's run
    is the run of the local rank with its number whose spool was written last (in the
    past ``recent_s``), else unknown ("")."""

    name = "fr"
    tables = ("fr_dumps", "fr_entries")

    def __init__(
        self,
        ctx: NodeContext,
        *,
        prefixes: tuple[str, ...] = (),
        interval_s: float = 5.0,
        recent_s: float = 3600.0,
    ) -> None:
        if interval_s <= 0:
            raise ValueError(f"fr interval_s must be > 0, got {interval_s}")
        self.ctx = ctx
        self.prefixes = prefixes or default_prefixes()
        self.interval_s = interval_s
        self.recent_s = recent_s
        self._pending: dict[str, _Seen] = {}
        self._taken: dict[str, _Seen] = {}
        self.refused: dict[str, str] = {}
        """Files not read, and why (another user's, writable by others, not readable)."""

    def _state_path(self) -> str:
        return os.path.join(self.ctx.spool_dir, STATE_FILE) if self.ctx.spool_dir else ""

    def open(self) -> None:
        """Load which dumps were taken before (kept in the spool folder across restarts)."""
        path = self._state_path()
        try:
            with open(path) as f:
                self._taken = {p: _Seen(int(v[0]), int(v[1])) for p, v in json.load(f).items()}
        except (OSError, ValueError, TypeError, KeyError, IndexError):
            self._taken = {}

    def _save(self) -> None:
        path = self._state_path()
        if not path:
            return
        try:
            with open(path + ".tmp", "w") as f:
                json.dump({p: [s.size, s.mtime_ns] for p, s in self._taken.items()}, f)
            os.replace(path + ".tmp", path)
        except OSError:
            pass  # then a restart re-reads these dumps; rows repeat, nothing is lost

    def files(self) -> list[str]:
        """Files matching the prefixes now, and those in the runs' private dump folders."""
        found: set[str] = set()
        patterns = [glob.escape(p) + "*" for p in self.prefixes]
        if self.ctx.spool_dir:
            spool = glob.escape(self.ctx.spool_dir)
            patterns.append(os.path.join(spool, "*", "a*", PRIVATE_DIR, "*"))
        for pattern in patterns:
            found.update(
                p
                for p in glob.glob(pattern)
                if os.path.isfile(p) and ".tmp" not in os.path.basename(p)
            )  # a dump being written goes to a temp name first
        return sorted(found)

    def _trusted(self, path: str) -> bool:
        """Whether ``path`` passes the owner rule; a refusal is logged once per reason."""
        why = untrusted_file(path)
        if why and self.refused.get(path) != why:
            log.warning("Flight Recorder dump %s skipped: %s", fit_text(path), why)
        if why:
            self.refused[path] = why
        else:
            self.refused.pop(path, None)
        return not why

    def collect(self, now_ns: int) -> Rows:
        """Rows of every dump that became stable since the last call. A dump whose rows
        cannot be built is named in the log and in :attr:`refused`, the others' rows kept."""
        rows: Rows = {}
        ready = []
        for path in self.files():
            try:
                st = os.stat(path)
            except OSError:
                continue
            seen = _Seen(st.st_size, st.st_mtime_ns)
            if self._taken.get(path) == seen:
                continue
            if self._pending.get(path) == seen:
                ready.append((path, seen))
            else:
                self._pending[path] = seen
        if not ready:
            return rows
        ranks = (
            scan_spool(self.ctx.spool_dir, alive_only=False, max_age_s=self.recent_s)
            if self.ctx.spool_dir
            else []
        )
        for path, seen in ready:
            self._pending.pop(path, None)
            if not self._trusted(path):
                continue
            try:
                more = self._rows_of(path, ranks)
            except Exception as exc:  # noqa: BLE001 - one bad dump never costs the others
                why = f"cannot be read ({type(exc).__name__}: {exc})"
                log.warning("Flight Recorder dump %s skipped: %s", fit_text(path), why)
                self.refused[path] = why
                continue
            finally:
                self._taken[path] = seen
            for table, items in more.items():
                rows.setdefault(table, []).extend(items)
        self._save()
        return rows

    def _rows_of(self, path: str, ranks: list[LocalRank]) -> Rows:
        """The rows of the dump at ``path``, filed under the run of its private folder, else
        of the local rank of its number (:func:`owner`)."""
        dump = read_dump(path)
        run = _private_run(path, self.ctx.spool_dir)
        if run is None:
            lr = owner(dump.rank, ranks)
            run = (lr.run_id, lr.attempt) if lr else ("", 0)
        return dump_rows(dump, run_id=run[0], attempt=run[1], host=self.ctx.host,
                         ts_ns=time.time_ns())  # fmt: skip


def _private_run(path: str, spool_dir: str) -> tuple[str, int] | None:
    """(run id, attempt) of a dump in ``<spool_dir>/<run_id>/a<attempt>/fr/``, else None."""
    if not spool_dir:
        return None
    rel = os.path.relpath(path, spool_dir).split(os.sep)
    if len(rel) == 4 and rel[1][:1] == "a" and rel[1][1:].isdigit() and rel[2] == PRIVATE_DIR:
        return rel[0], int(rel[1][1:])
    return None
