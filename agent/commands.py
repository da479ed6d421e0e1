"""The collector side of the CLI: ``ranksight stacks``, ``ranksight fr-import`` and the
collectors of ``ranksight agent`` (registered in ``ranksight/cli.py``)."""

from __future__ import annotations

import json
import logging
import socket
import sys

import typer

from ranksight.words import counted

from .collect import CollectConfig, Collection, default_data_dir, parse_collectors

__all__ = ["fr_import", "parse_collectors", "stacks", "start_collection"]

log = logging.getLogger("ranksight.agent")


def start_collection(
    store, spool_dir: str, spec: str, stall_s: float, sysfs_root: str = "/sys"
) -> Collection | None:
    """Start the collectors ``spec`` names (``default``, ``none`` or a list) writing to
    ``store``; None for ``none``. Raises ValueError for an unknown name or bad value."""
    names = parse_collectors(spec)
    if not names:
        return None
    config = CollectConfig(
        collectors=names,
        spool_dir=spool_dir,
        data_dir=default_data_dir(),
        stall_s=stall_s,
        sysfs_root=sysfs_root,
    )
    collection = Collection(store, config)
    collection.start()
    log.info("collectors started: %s", ", ".join(names))
    return collection


def stacks(
    run: str = typer.Option(..., "--run", help="run id"),
    attempt: int = typer.Option(None, help="attempt (default: the latest)"),
    spool: str = typer.Option(
        None, help="spool folder of the ranks (default $RANKSIGHT_SPOOL_DIR)"
    ),
    store: str = typer.Option(
        None, "--store", help="store URL (default $RANKSIGHT_STORE or ./.ranksight/store)"
    ),
    native: bool = typer.Option(False, "--native", help="also show native frames (slower)"),
    format: str = typer.Option("text", help="text or json"),
) -> None:
    """Dump the Python stacks of RUN's ranks on this node now (py-spy), store and print them."""
    from ranksight.cli import _fail, _open, console
    from ranksight.collectors.base import Unavailable
    from ranksight.collectors.pyspy import PySpyConfig
    from ranksight.store import StoreError
    from ranksight.trainer_hooks.config import default_spool_dir

    from .stacks import format_stacks, take_stacks

    if format not in ("text", "json"):
        _fail(f"--format must be text or json, got {format!r}", 2)
    s = _open(store)
    try:
        rows = take_stacks(
            s,
            run,
            spool_dir=spool or default_spool_dir(),
            attempt=attempt,
            config=PySpyConfig(native=native),
        )
    except (Unavailable, StoreError) as exc:
        _fail(str(exc))
    if not rows:
        _fail(f"run {run!r} has no live rank on {socket.gethostname()} (spool or ranks table)")
    if format == "json":
        keep = ("rank", "pid", "ok", "error", "threads", "summary", "took_ms")
        print(json.dumps([{k: r[k] for k in keep} for r in rows], indent=1))
    else:
        console.print(format_stacks(rows), markup=False, highlight=False)
    if not any(r["ok"] for r in rows):
        raise typer.Exit(1)


def fr_import(
    paths: list[str] = typer.Argument(..., help="Flight Recorder dump files (pickle or JSON)"),
    run: str = typer.Option(..., "--run", help="run id to file them under"),
    attempt: int = typer.Option(0, help="attempt"),
    store: str = typer.Option(
        None, "--store", help="store URL (default $RANKSIGHT_STORE or ./.ranksight/store)"
    ),
) -> None:
    """Store Flight Recorder dumps (rank from each file name's trailing number) and say what
    could not be read."""
    import time

    from ranksight.cli import _fail, _open
    from ranksight.collectors.base import frame
    from ranksight.collectors.flight_recorder import read_dump
    from ranksight.collectors.fr_ingest import dump_rows
    from ranksight.store import StoreError

    s = _open(store)
    host = socket.gethostname()
    unread = 0
    for path in paths:
        dump = read_dump(path)
        if not dump.format:  # nothing in it could be read: say so, store nothing
            unread += 1
            print(f"{path}: not stored: {'; '.join(dump.problems)}", file=sys.stderr)
            continue
        rows = dump_rows(dump, run_id=run, attempt=attempt, host=host, ts_ns=time.time_ns())
        try:
            for table, items in rows.items():
                s.insert(table, frame(table, items))
        except StoreError as exc:
            _fail(str(exc))
        note = "; ".join(dump.problems) or "ok"
        print(
            f"{path}: rank {dump.rank}, version {dump.version or '?'}, {counted(len(dump.entries), 'entry', 'entries')}: {note}"
        )
    if unread:
        _fail(
            f"{unread} of {counted(len(paths), 'file')} could not be read as Flight Recorder dumps"
        )
