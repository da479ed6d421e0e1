"""``ranksight import PATH...``: artifacts of a job that was never hooked -> a run
(``ranksight/importer/``), then the report on it."""

from __future__ import annotations

import os
import sys

import typer
from rich.markup import escape

from ranksight.cli.common import STORE_OPTION, analysis_run, console, err, fail, open_store_arg
from ranksight.ground import env
from ranksight.importer.summary import ARTIFACTS, file_line, nothing_imported, summary_lines
from ranksight.store.url import MEMORY


def import_cmd(
    paths: list[str] = typer.Argument(
        ...,
        metavar="PATH",
        help=f"files, folders or archives: {ARTIFACTS} (kind read from content)",
    ),
    run: str = typer.Option(None, "--run", help="run id (default: import-<hash of the paths>)"),
    attempt: int = typer.Option(0, min=0, help="attempt"),
    store: str = STORE_OPTION,
    memory_mb: int = typer.Option(
        512,
        "--memory-mb",
        min=16,
        help="memory budget, MiB: a dump or py-spy file read whole may inflate to a 32nd of "
        "it, one trace event take a 16th (at least 1 MiB); a log line is cut at 1 MiB; a "
        "file past its limit is named and not read",
    ),  # fmt: skip
    progress: bool = typer.Option(None, help="progress bar (default: when stderr is a terminal)"),
    report: bool = typer.Option(True, help="analyze the run and print the report"),
    format: str = typer.Option("text", help="report format: text, json or markdown"),
) -> None:
    """Import what a job left behind into a run and report on it; the run is kept only
    in --store or $RANKSIGHT_STORE, else read into memory and forgotten at exit (with
    --no-report, in the default store) (exit 3: a fault found,
    0: none in what was read (undecided), 2: a usage error, 1: a path that does not exist
    or nothing could be imported, as for a store that is not there). A file that cannot be read is named on one line
    ('error: could not import PATH (KIND): why') and the rest are imported: the exit code
    is then the report's on what was imported (3 or 0)."""
    from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn

    from ranksight import report as rep
    from ranksight.importer.run import ImportConfig, import_paths
    from ranksight.store import StoreError

    if format not in rep.FORMATS:
        fail(f"--format must be one of {', '.join(rep.FORMATS)}, got {format!r}", 2)
    try:
        cfg = ImportConfig(run_id=run, attempt=attempt, memory_mb=memory_mb)
    except ValueError as e:
        fail(str(e), 2)
    kept = store or os.environ.get(env.STORE) or not report  # asked to persist
    s = open_store_arg(store if kept else MEMORY)
    show = sys.stderr.isatty() if progress is None else progress
    bar = Progress(
        "[progress.description]{task.description}", BarColumn(), DownloadColumn(),
        TransferSpeedColumn(), console=err, disable=not show, transient=True,
    )  # fmt: skip
    with bar:
        task = bar.add_task("importing", total=None)

        def tick(done: int, total: int, path: str) -> None:
            bar.update(task, completed=done, total=total, description=path[-40:])

        try:
            result = import_paths(s, paths, cfg, tick)
        except FileNotFoundError as e:  # what it names is not there: 1, as a missing --store
            fail(str(e))
        except StoreError as e:
            fail(str(e))
    out = sys.stdout if format == "text" else sys.stderr  # keep json/markdown clean
    for f in result.files:
        line = file_line(f)
        if f.ok:
            print(line, file=out)
        else:
            err.print(f"[red]error:[/] {escape(line)}", highlight=False, emoji=False)
    if not result.imported:
        fail(nothing_imported(paths, len(result.files)))
    counts = ", ".join(f"{t} {n:,}" for t, n in sorted(result.rows.items()))
    print(f"run {result.run_id}: rows written per table: {counts}", file=out)
    if not kept:
        print(f"run {result.run_id} is not kept: give --store to keep it", file=out)
    for line in summary_lines(result.meta):
        print(line, file=out)
    if not report:
        return
    from ranksight.analyzer import analyze

    try:
        # saved where the import persists (findings, clock offsets, the UI's summary); an
        # in-memory one-shot import is forgotten at exit, so it writes nothing more
        analysis = analyze(s, result.run_id, result.attempt, save=bool(kept))
        rep.emit(analysis, analysis_run(s, result.run_id, analysis.attempt), format, console)
    except StoreError as e:
        fail(str(e))
    raise typer.Exit(rep.exit_code(analysis))
