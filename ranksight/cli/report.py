"""``ranksight report``: diagnose a stored run and print the root-cause report, once or
following a running job (``--watch``)."""

from __future__ import annotations

import time

import typer

from ranksight.cli.common import STORE_OPTION, analysis_run, console, fail, open_store_arg


def report(
    run: str = typer.Option(..., "--run", help="run id (see 'ranksight runs')"),
    attempt: int = typer.Option(None, help="attempt (default: the latest)"),
    store: str = STORE_OPTION,
    format: str = typer.Option("text", help="text, json or markdown"),
    save: bool = typer.Option(
        False,
        help="store the findings (the UI's and 'ranksight runs' findings count); by "
        "default the report only reads",
    ),
    steps: str = typer.Option(None, help="only these steps: A:B, A:, :B or N"),
    since: str = typer.Option(
        None, help="only the steps of the last 90s, 10m, 2h or 1d (s, m, h, d: a unit is required)"
    ),
    watch: bool = typer.Option(
        False,
        "--watch",
        help="follow a running job: re-analyze every --interval s, print when the findings change, stop when it ends",
    ),
    interval: float = typer.Option(10.0, min=1.0, help="seconds between analyses with --watch"),
) -> None:
    """Diagnose a stored run and print the root-cause report (exit 3 if a culprit is found).
    It reads the store and changes nothing (no schema migration: an older store is an
    error naming 'ranksight db migrate'), unless --save stores the findings."""
    from ranksight import report as rep
    from ranksight.analyzer import analyze
    from ranksight.analyzer.window import parse_since, parse_steps
    from ranksight.store import StoreError

    if format not in rep.FORMATS:
        fail(f"--format must be one of {', '.join(rep.FORMATS)}, got {format!r}", 2)
    try:
        window = parse_steps(steps) if steps is not None else None
        since_s = parse_since(since) if since is not None else None
    except ValueError as e:
        fail(str(e), 2)
    if window is not None and since_s is not None:
        fail("give --steps or --since, not both", 2)
    s = open_store_arg(store, must_exist=True)

    def once():
        try:
            a = analyze(s, run, attempt, save=save, window=window, since_s=since_s)
            return a, analysis_run(s, run, a.attempt)
        except StoreError as e:
            fail(str(e))

    analysis, run_row = once()
    rep.emit(analysis, run_row, format, console)
    seen = rep.signature(analysis)
    try:
        while watch and run_row.get("status") == "running":
            time.sleep(interval)
            analysis, run_row = once()
            if rep.signature(analysis) != seen:
                seen = rep.signature(analysis)
                console.rule(f"{time.strftime('%H:%M:%S')} findings changed")
                rep.emit(analysis, run_row, format, console)
        if watch:
            console.print(f"run {run} is {run_row.get('status')}: done watching")
    except KeyboardInterrupt:
        pass
    raise typer.Exit(rep.exit_code(analysis))
