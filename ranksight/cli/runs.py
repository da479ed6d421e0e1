"""``ranksight runs``: the stored runs as a table."""

from __future__ import annotations

from rich.console import Console

from ranksight.cli.common import STORE_OPTION, console, open_store_arg


def runs(store: str = STORE_OPTION) -> None:
    """List stored runs, newest first: when each started (UTC), status (running, finished,
    hung, crashed, stopped, as the web UI's Runs page says it), world size, mesh, steps,
    median step time, findings."""
    from rich.table import Table

    from ranksight.ui.data.runs import runs_table

    frame = runs_table(open_store_arg(store, must_exist=True))
    if frame.empty:
        console.print("no runs in this store yet (try 'ranksight demo')")
        return
    table = Table()
    table.add_column("run_id", no_wrap=True)  # whole: it is what the other commands take
    for col in ("attempt", "started (UTC)", "status", "world", "dp x tp x pp"):
        table.add_column(col, no_wrap=True)
    for col in ("steps", "step ms", "findings"):
        table.add_column(col, justify="right")
    for r in frame.to_dict("records"):
        table.add_row(
            r["run_id"],
            str(r["attempt"]),
            started(r["started_ns"]),
            r["status"],
            str(r["world_size"]),
            f"{r['dp']} x {r['tp']} x {r['pp']}",
            str(r["steps"]),
            "" if r["step_ms"] != r["step_ms"] else f"{r['step_ms']:.0f}",
            str(r["findings"]),
        )
    # Into a pipe or file, no terminal sets the width: print the table whole, not at 80.
    (console if console.is_terminal else Console(width=200)).print(table)


def started(ns) -> str:
    """``2026-12-02 04:18:07`` (UTC) of a run's start in ns since the epoch; ``""`` if unknown."""
    import datetime

    try:
        t = datetime.datetime.fromtimestamp(int(ns) / 1e9, tz=datetime.timezone.utc)
    except (TypeError, ValueError, OverflowError, OSError):
        return ""
    return t.strftime("%Y-%m-%d %H:%M:%S") if int(ns) > 0 else ""
