"""``ranksight stacks``: py-spy the ranks of a run on this node now (``agent/stacks.py``)."""

from __future__ import annotations

import json
import socket

import typer

from ranksight.cli.common import STORE_OPTION, console, fail, open_store_arg


def stacks(
    run: str = typer.Option(..., "--run", help="run id"),
    attempt: int = typer.Option(None, help="attempt (default: the latest)"),
    spool: str = typer.Option(
        None, help="spool folder of the ranks (default $RANKSIGHT_SPOOL_DIR)"
    ),
    store: str = STORE_OPTION,
    native: bool = typer.Option(False, "--native", help="also show native frames (slower)"),
    format: str = typer.Option("text", help="text or json"),
) -> None:
    """Dump the Python stacks of RUN's ranks on this node now (py-spy), store and print them."""
    from ranksight.agent.stacks import format_stacks, take_stacks
    from ranksight.collectors.base import Unavailable
    from ranksight.collectors.pyspy import PySpyConfig
    from ranksight.store import StoreError
    from ranksight.trainer_hooks.config import default_spool_dir

    if format not in ("text", "json"):
        fail(f"--format must be text or json, got {format!r}", 2)
    s = open_store_arg(store)
    try:
        rows = take_stacks(
            s,
            run,
            spool_dir=spool or default_spool_dir(),
            attempt=attempt,
            config=PySpyConfig(native=native),
        )
    except (Unavailable, StoreError) as exc:
        fail(str(exc))
    if not rows:
        fail(f"run {run!r} has no live rank on {socket.gethostname()} (spool or ranks table)")
    if format == "json":
        keep = ("rank", "pid", "ok", "error", "threads", "summary", "took_ms")
        print(json.dumps([{k: r[k] for k in keep} for r in rows], indent=1))
    else:
        console.print(format_stacks(rows), markup=False, highlight=False)
    if not any(r["ok"] for r in rows):
        raise typer.Exit(1)
