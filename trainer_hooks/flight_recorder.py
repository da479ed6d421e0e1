"""PyTorch's Flight Recorder from inside the rank: where it dumps, and dumps on request.

torch keeps the last ``TORCH_NCCL_TRACE_BUFFER_SIZE`` / ``TORCH_FR_BUFFER_SIZE``
collectives of every process group (on by default in recent torch for NCCL and gloo) and
writes them on a watchdog timeout to ``$TORCH_FR_DUMP_TEMP_FILE<rank>``. A hung job whose
watchdog has not fired yet (10 minutes by default) has no dump; the node agent can ask for
one: it touches ``<spool_dir>/<run_id>/a<attempt>/fr-dump-request`` (:func:`request_dump`),
and each rank's writer thread, which keeps running while training is stuck, writes the
dump (pickle, torch's own format) to the same path torch would use, where the agent's
Flight Recorder collector picks it up.

Where the job sets no dump path (neither ``TORCH_FR_DUMP_TEMP_FILE`` nor
``TORCH_NCCL_DEBUG_INFO_TEMP_FILE``), torch's default is ``/tmp/nccl_trace_rank_``, a folder
every user may write to; the hooks then set ``TORCH_NCCL_DEBUG_INFO_TEMP_FILE`` to a
``0700`` folder of the run, ``<run_dir>/fr/nccl_trace_rank_`` (:func:`private_prefix`;
torch reads it when it first writes a dump), where the agent finds dumps of that run.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from ranksight.ground import env

REQUEST_FILE = "fr-dump-request"
DEFAULT_PREFIX = "/tmp/nccl_trace_rank_"
"""torch's default dump prefix."""


PRIVATE_DIR = "fr"
"""The run's dump folder under ``<spool>/<run_id>/a<attempt>/`` (the agent's
``collectors/fr_ingest.py`` looks there)."""


def private_prefix(run_dir: str) -> str:
    """Point torch's dumps at ``<run_dir>/fr/nccl_trace_rank_`` (made ``0700`` whatever the
    umask, when the hooks create it) unless the job set a dump path; returns the prefix
    now in force. Never raises: a folder that cannot be made leaves torch's default."""
    if os.environ.get(env.TORCH_FR_DUMP_TEMP_FILE) or os.environ.get(
        env.TORCH_NCCL_DEBUG_INFO_TEMP_FILE
    ):
        return dump_prefix()
    folder = os.path.join(run_dir, PRIVATE_DIR)
    try:
        os.mkdir(folder, 0o700)
        os.chmod(folder, 0o700)  # mkdir's mode is cut by the umask
    except FileExistsError:
        pass
    except OSError:
        return dump_prefix()
    os.environ[env.TORCH_NCCL_DEBUG_INFO_TEMP_FILE] = os.path.join(folder, "nccl_trace_rank_")
    return dump_prefix()


def dump_prefix() -> str:
    """Where torch (and these hooks) write dumps: ``$TORCH_FR_DUMP_TEMP_FILE``, else
    ``$TORCH_NCCL_DEBUG_INFO_TEMP_FILE``, else torch's default; the rank is appended."""
    return (os.environ.get(env.TORCH_FR_DUMP_TEMP_FILE)
            or os.environ.get(env.TORCH_NCCL_DEBUG_INFO_TEMP_FILE) or DEFAULT_PREFIX)  # fmt: skip


def request_dump(run_dir: str) -> str:
    """Ask every rank of the run writing to ``run_dir`` (``<spool>/<run_id>/a<attempt>``) for
    a Flight Recorder dump; returns the request file's path."""
    path = os.path.join(run_dir, REQUEST_FILE)
    with open(path, "a"):
        os.utime(path)
    return path


def dump_bytes() -> bytes:
    """The Flight Recorder's current contents (pickle, torch's format).

    torch keeps one ring for NCCL process groups (``_dump_nccl_trace``) and one for the
    other backends (``_dump_fr_trace``: gloo); on an NCCL job the second holds nothing
    (``entries == []``, ``pg_config == {}``: seen on 2 H200s, torch 2.11). Both are read;
    when both hold something, their entries (ordered by ``time_created_ns``), ``pg_config``
    and ``pg_status`` are merged into one dump. Raises RuntimeError if this torch has no
    dump entry point, or every one failed."""
    c10d = torch._C._distributed_c10d
    dumps, errors = [], []
    for name in ("_dump_nccl_trace", "_dump_fr_trace"):
        fn = getattr(c10d, name, None)
        if fn is None:
            continue
        try:
            dumps.append(fn())
        except Exception as exc:  # e.g. no NCCL in this build or process
            errors.append(f"{name}: {exc}")
    if not dumps:
        raise RuntimeError(
            "; ".join(errors) or "this torch build has no Flight Recorder dump function"
        )
    if len(dumps) == 1:
        return dumps[0]
    try:
        return _merged(dumps)
    except Exception:  # noqa: BLE001 - an unexpected layout: NCCL's ring as it is
        return dumps[0]


def _merged(dumps: list[bytes]) -> bytes:
    """One dump of several rings' (see :func:`dump_bytes`): the one that holds anything,
    else their entries in time order and their groups. A group name in two rings (one
    process group on two backends) keeps both, the second as ``<name>:<n>``."""
    import pickle

    docs = [pickle.loads(d) for d in dumps]  # noqa: S301 - this process's own dump
    full = [i for i, d in enumerate(docs) if d.get("entries") or d.get("pg_config")]
    if len(full) <= 1:
        return dumps[full[0] if full else 0]
    merged = dict(docs[full[0]])
    merged["entries"] = sorted(
        (e for i in full for e in (docs[i].get("entries") or [])),
        key=lambda e: e.get("time_created_ns") or 0,
    )
    for key in ("pg_config", "pg_status"):
        out: dict = {}
        for n, i in enumerate(full):
            for name, value in (docs[i].get(key) or {}).items():
                out[name if name not in out else f"{name}:{n}"] = value
        merged[key] = out
    return pickle.dumps(merged)


class DumpOnRequest:
    """Checked from the hooks' writer thread: when the request file is newer than the last
    dump, write one to ``<prefix><rank>`` (temp file, then rename)."""

    def __init__(self, run_dir: str, rank: int) -> None:
        self.request = os.path.join(run_dir, REQUEST_FILE)
        self.path = f"{private_prefix(run_dir)}{rank}"
        self._done_mtime = self._mtime()  # a request older than attach is not for us
        self.dumps = 0
        self.error = ""

    def _mtime(self) -> float:
        try:
            return os.stat(self.request).st_mtime
        except OSError:
            return 0.0

    def check(self) -> list[dict[str, Any]]:
        """Dump if asked; never raises (the error is kept in ``error``)."""
        mtime = self._mtime()
        if mtime <= self._done_mtime:
            return []
        self._done_mtime = mtime
        try:
            data = dump_bytes()
            tmp = f"{self.path}.tmp{os.getpid()}"
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, self.path)
            self.dumps += 1
        except Exception as e:
            self.error = f"Flight Recorder dump failed: {e}"
        return []

    def meta(self) -> dict[str, Any]:
        """What the run's metadata records about the Flight Recorder."""
        return {"dump_prefix": dump_prefix(), "request_file": self.request,
                "buffer_entries": os.environ.get("TORCH_NCCL_TRACE_BUFFER_SIZE")
                or os.environ.get("TORCH_FR_BUFFER_SIZE") or "torch default"}  # fmt: skip
