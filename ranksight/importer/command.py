"""``ranksight import PATH...``: artifacts of a job that was never hooked -> a run, then
the report on it (registered in ``ranksight/cli.py``)."""

from __future__ import annotations

import sys

import typer

from ranksight.words import counted

ARTIFACTS = (
    "text logs (consoles, job logs, one rank's log, dmesg: watchdog timeouts, desync "
    "reports, torchrun summaries, NCCL_DEBUG, fr_trace/RAS output, GPU errors), Flight "
    "Recorder dumps, Kineto traces, py-spy dumps, What-if Analysis parquet traces"
)
"""What ``import`` reads (see :mod:`ranksight.importer.sources`)."""


def nothing_imported(paths: list[str], files: int) -> str:
    """Why an import of ``paths`` that took nothing failed, naming them and what was
    looked for; ``files``: how many files were found there."""
    where = ", ".join(paths)
    if not files:
        return (
            f"nothing to import: no files in {where} (hidden files and folders are passed "
            f"over); looked for {ARTIFACTS}, or archives of them"
        )
    return (
        f"nothing could be imported from {where}: no file there ({counted(files, 'file')} "
        f"found, listed above) is one of: {ARTIFACTS}, or an archive of them"
    )


def import_cmd(
    paths: list[str] = typer.Argument(
        ...,
        metavar="PATH",
        help=f"files, folders or archives: {ARTIFACTS} (kind read from content)",
    ),
    run: str = typer.Option(None, "--run", help="run id (default: import-<hash of the paths>)"),
    attempt: int = typer.Option(0, min=0, help="attempt"),
    store: str = typer.Option(
        None, "--store", help="store URL (default $RANKSIGHT_STORE or ./.ranksight/store)"
    ),
    memory_mb: int = typer.Option(
        512, "--memory-mb", min=16,
        help="memory budget, MiB: a dump or py-spy file read whole may inflate to a 32nd of "
        "it, one trace event take a 16th (at least 1 MiB); a log line is cut at 1 MiB; a "
        "file past its limit is named and not read",
    ),  # fmt: skip
    progress: bool = typer.Option(None, help="progress bar (default: when stderr is a terminal)"),
    report: bool = typer.Option(True, help="analyze the run and print the report"),
    format: str = typer.Option("text", help="report format: text, json or markdown"),
) -> None:
    """Import what a job left behind into a run and report on it (exit 3: a fault found,
    0: none in what was read (undecided), 2: a usage error or a path that does not exist,
    1: nothing could be imported). A file that cannot be read is named on one line
    ('error: could not import PATH (KIND): why') and the rest are imported: the exit code
    is then the report's on what was imported (3 or 0)."""
    from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn

    from ranksight import report as rep
    from ranksight.cli import _fail, _open, analysis_run, emit, err
    from ranksight.store import StoreError

    from .run import ImportConfig, import_paths

    if format not in rep.FORMATS:
        _fail(f"--format must be one of {', '.join(rep.FORMATS)}, got {format!r}", 2)
    try:
        cfg = ImportConfig(run_id=run, attempt=attempt, memory_mb=memory_mb)
    except ValueError as e:
        _fail(str(e), 2)
    s = _open(store)
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
        except FileNotFoundError as e:
            _fail(str(e), 2)
        except StoreError as e:
            _fail(str(e))
    out = sys.stdout if format == "text" else sys.stderr  # keep json/markdown clean
    for f in result.files:
        line = file_line(f)
        if f.ok:
            print(line, file=out)
        else:
            err.print(f"[red]error:[/] {line}", markup=True, highlight=False)
    if not result.imported:
        _fail(nothing_imported(paths, len(result.files)))
    counts = ", ".join(f"{t} {n:,}" for t, n in sorted(result.rows.items()))
    print(f"run {result.run_id}: rows written per table: {counts}", file=out)
    for line in summary_lines(result.meta):
        print(line, file=out)
    if not report:
        return
    from ranksight.analyzer import analyze

    try:
        analysis = analyze(s, result.run_id, result.attempt)
        emit(analysis, analysis_run(s, result.run_id, analysis.attempt), format)
    except StoreError as e:
        _fail(str(e))
    raise typer.Exit(rep.exit_code(analysis))


def file_line(f) -> str:
    """What became of one input (a :class:`~ranksight.importer.run.FileResult`), as a line
    naming it: ``PATH: KIND rank N: what was read``, ``skipped PATH: why`` (no artifact),
    ``could not import PATH (KIND rank N): what is wrong``."""
    rank = "" if f.rank is None else f" rank {f.rank}"
    if f.kind is None:
        why = f.message.removeprefix("skipped: ")
        return f"skipped {f.path}{f' ({rank.strip()})' if rank else ''}: {why}"
    if not f.ok:
        return (
            f"could not import {f.path} ({f.kind}{rank}): {f.message.removeprefix(f.kind + ': ')}"
        )
    return f"{f.path}: {f.kind}{rank}: {f.message}"


def summary_lines(meta: dict) -> list[str]:
    """What the import found beyond the report's findings: communication time per
    collective type (Kineto traces) and each rank's NCCL version, topology and transport
    lines (``NCCL_DEBUG=INFO`` logs, the first 4 a rank)."""
    out = []
    comm = meta.get("comm_time_by_op") or {}
    if comm:
        parts = [
            f"{op} {int(v['kernels'])} kernels {v['total_ms']:.1f} ms"
            for op, v in sorted(comm.items(), key=lambda kv: -kv[1]["total_ms"])
        ]
        out.append("communication time per collective type (all ranks): " + ", ".join(parts))
    for rank, notes in sorted((meta.get("nccl_notes") or {}).items(), key=lambda kv: int(kv[0])):
        if notes:
            who = f"rank {rank}" if int(rank) >= 0 else "a process of no known rank"
            out.append(f"{who} NCCL: " + "; ".join(notes[:4]))
    return out
