"""``ranksight fr-import``: store PyTorch Flight Recorder dump files under a run."""

from __future__ import annotations

import socket
import sys

import typer

from ranksight.cli.common import STORE_OPTION, fail, open_store_arg
from ranksight.ground.words import counted


def fr_import(
    paths: list[str] = typer.Argument(..., help="Flight Recorder dump files (pickle or JSON)"),
    run: str = typer.Option(..., "--run", help="run id to file them under"),
    attempt: int = typer.Option(0, help="attempt"),
    store: str = STORE_OPTION,
) -> None:
    """Store Flight Recorder dumps (rank from each file name's trailing number) and say what
    could not be read."""
    import time

    from ranksight.collectors.base import frame
    from ranksight.collectors.flight_recorder import read_dump
    from ranksight.collectors.fr_ingest import dump_rows
    from ranksight.store import StoreError

    s = open_store_arg(store)
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
            fail(str(exc))
        note = "; ".join(dump.problems) or "ok"
        print(
            f"{path}: rank {dump.rank}, version {dump.version or '?'}, {counted(len(dump.entries), 'entry', 'entries')}: {note}"
        )
    if unread:
        fail(
            f"{unread} of {counted(len(paths), 'file')} could not be read as Flight Recorder dumps"
        )
