"""The ``ranksight`` command: a thin layer over the library APIs.

Exit codes: 0 ok / no culprit, 3 a culprit was found (``report``, ``demo``), 1 an error
(bad store, unknown run, failed job), 2 a usage error, 141 stdout was closed before all was
printed (``ranksight report ... | head``; quiet, as git and coreutils end on SIGPIPE).
"""

from __future__ import annotations

import errno
import logging
import os
import sys
import time

import typer
from rich.console import Console
from rich.markup import escape

from ranksight import report as rep
from ranksight.store.base import MAX_ATOMIC_ROWS
from ranksight.words import counted

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Find the slow rank, the slow link and the stuck rank of a distributed PyTorch job,"
    " say why, and what it costs. Exit codes: 0 ok or no culprit, 3 a culprit found"
    " (report, demo, import), 1 an error, 2 a usage error.",
)


def _flags_show_no_type() -> None:
    """In --help, an on/off flag (``--watch``, ``--save/--no-save``, ``--help``) shows no
    value type. typer's rich help (0.2x) labels each one ``<bool>`` as if it took a value;
    click's plain help and older typer show none. Versions without the hook are left as
    they are."""
    from typer.core import TyperOption

    shown = getattr(TyperOption, "display_type_rich", None)
    if shown is None:
        return

    def display_type_rich(self, ctx):
        return None if self.is_flag and not self.count else shown(self, ctx)

    TyperOption.display_type_rich = display_type_rich


_flags_show_no_type()


def _version(value: bool) -> None:
    if value:
        from ranksight import __version__

        print(f"ranksight {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="print the version and exit"
    ),
) -> None:
    """Find the slow rank, the slow link and the stuck rank of a distributed PyTorch job."""


console = Console()
err = Console(stderr=True, soft_wrap=True)  # one error, one line

StoreOpt = typer.Option(
    None,
    "--store",
    help="store URL: a folder (chdb) or clickhouse://host:port/db; default $RANKSIGHT_STORE or ./.ranksight/store",
)


def _fail(message: str, code: int = 1) -> None:
    """Print ``error: message`` (text, never read as markup: it may quote a job's log or a
    path) and exit with ``code``."""
    err.print(f"[red]error:[/] {escape(message)}")
    raise typer.Exit(code)


def _open(url: str | None, *, must_exist: bool = False):
    """The store ``--store`` names, its schema brought up to date. ``must_exist`` (the
    commands that only read): a chdb folder that is not there is an error, not a new
    empty store made at a mistyped path."""
    from ranksight.store import StoreError, open_store
    from ranksight.store.url import default_store_url, missing_store, refuse_password

    try:
        refuse_password(url)
        store = open_store(url or default_store_url())
        if must_exist and (absent := missing_store(store, url)):
            _fail(absent)
        store.init_schema()
        return store
    except StoreError as e:
        _fail(str(e))
    except ValueError as e:
        _fail(f"bad --store {url!r}: {e}")


@app.command()
def demo(
    inject: str = typer.Option(
        "slow:rank=5,factor=3,from_step=4", help="fault to inject ('none' for a clean run)"
    ),
    steps: int = typer.Option(24, min=4, help="training steps"),
    store: str = StoreOpt,
    dp: int = typer.Option(2, min=1),
    tp: int = typer.Option(2, min=1),
    pp: int = typer.Option(2, min=1),
    format: str = typer.Option("text", help="report format: text, json or markdown"),
) -> None:
    """Train a real 3D-parallel GPT on CPU with an injected fault, collect, diagnose, report."""
    from ranksight.demo import DemoConfig, run_demo

    try:
        cfg = DemoConfig(
            inject=inject, steps=steps, store=store, dp=dp, tp=tp, pp=pp, format=format
        )
    except ValueError as e:
        _fail(str(e), 2)
    raise typer.Exit(run_demo(cfg, console, err))


@app.command()
def report(
    run: str = typer.Option(..., "--run", help="run id (see 'ranksight runs')"),
    attempt: int = typer.Option(None, help="attempt (default: the latest)"),
    store: str = StoreOpt,
    format: str = typer.Option("text", help="text, json or markdown"),
    save: bool = typer.Option(True, help="store the findings for the UI"),
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
    """Diagnose a stored run and print the root-cause report (exit 3 if a culprit is found)."""
    from ranksight.analyzer import analyze
    from ranksight.analyzer.window import parse_since, parse_steps
    from ranksight.store import StoreError

    if format not in rep.FORMATS:
        _fail(f"--format must be one of {', '.join(rep.FORMATS)}, got {format!r}", 2)
    try:
        window = parse_steps(steps) if steps is not None else None
        since_s = parse_since(since) if since is not None else None
    except ValueError as e:
        _fail(str(e), 2)
    if window is not None and since_s is not None:
        _fail("give --steps or --since, not both", 2)
    s = _open(store, must_exist=True)

    def once():
        try:
            a = analyze(s, run, attempt, save=save, window=window, since_s=since_s)
            return a, analysis_run(s, run, a.attempt)
        except StoreError as e:
            _fail(str(e))

    analysis, run_row = once()
    emit(analysis, run_row, format)
    seen = rep.signature(analysis)
    try:
        while watch and run_row.get("status") == "running":
            time.sleep(interval)
            analysis, run_row = once()
            if rep.signature(analysis) != seen:
                seen = rep.signature(analysis)
                console.rule(f"{time.strftime('%H:%M:%S')} findings changed")
                emit(analysis, run_row, format)
        if watch:
            console.print(f"run {run} is {run_row.get('status')}: done watching")
    except KeyboardInterrupt:
        pass
    raise typer.Exit(rep.exit_code(analysis))


def analysis_run(store, run_id: str, attempt: int) -> dict:
    """The run's row (status, mesh, meta) for the report headline."""
    from ranksight.analyzer.queries import resolve_attempt

    return resolve_attempt(store, run_id, attempt)[0]


def emit(analysis, run_row: dict, format: str, out: Console | None = None) -> None:
    """Print the analysis in ``format`` (text goes to ``out``, default stdout)."""
    if format == "json":
        print(rep.to_json(analysis, run_row))
    elif format == "markdown":
        print(rep.to_markdown(analysis, run_row), end="")
    else:
        rep.print_text(analysis, out or console, run_row)


@app.command()
def runs(store: str = StoreOpt) -> None:
    """List stored runs, newest first: status (running, finished, hung, crashed, as the
    web UI's Runs page says it), world size, mesh, steps, median step time, findings."""
    from rich.table import Table

    from ranksight.ui.data.runs import runs_table

    frame = runs_table(_open(store, must_exist=True))
    if frame.empty:
        console.print("no runs in this store yet (try 'ranksight demo')")
        return
    table = Table()
    table.add_column("run_id", no_wrap=True)  # whole: it is what the other commands take
    for col in ("attempt", "status", "world", "dp x tp x pp"):
        table.add_column(col, no_wrap=True)
    for col in ("steps", "step ms", "findings"):
        table.add_column(col, justify="right")
    for r in frame.to_dict("records"):
        table.add_row(
            r["run_id"],
            str(r["attempt"]),
            r["status"],
            str(r["world_size"]),
            f"{r['dp']} x {r['tp']} x {r['pp']}",
            str(r["steps"]),
            "" if r["step_ms"] != r["step_ms"] else f"{r['step_ms']:.0f}",
            str(r["findings"]),
        )
    # Into a pipe or file, no terminal sets the width: print the table whole, not at 80.
    (console if console.is_terminal else Console(width=200)).print(table)


@app.command()
def agent(
    ctx: typer.Context,
    spool: str = typer.Option(
        None, help="spool folder the ranks write to (default $RANKSIGHT_SPOOL_DIR)"
    ),
    store: str = StoreOpt,
    interval: float = typer.Option(1.0, min=0.05, help="seconds between batches"),
    once: bool = typer.Option(False, "--once", help="ship what is there and exit"),
    batch_rows: int = typer.Option(
        500_000, min=1, max=MAX_ATOMIC_ROWS, help="most records in one batch (one insert a table)"
    ),
    buffer_dir: str = typer.Option(None, help="disk buffer folder (default: under the spool)"),
    buffer_mb: int = typer.Option(1024, min=1, help="disk buffer bound, MiB"),
    drop: str = typer.Option(
        "drop_oldest", help="when the buffer is full: drop_oldest or drop_newest"
    ),
    stats_interval: float = typer.Option(10.0, min=0, help="seconds between agent_stats rows"),
    keep_spool: bool = typer.Option(
        False, "--keep-spool", help="keep spool segments once stored (default: delete them)"
    ),
    collectors: str = typer.Option(
        "default",
        help="node collectors: default, none, or some of nvml,xid,topology,rdma,netdev,host,fr,stacks,postmortem",
    ),
    stall_s: float = typer.Option(
        60.0,
        "--stall-s",
        min=1.0,
        help="py-spy a run's ranks when one made no progress this long (s)",
    ),
    otlp_endpoint: str = typer.Option(
        None, "--otlp-endpoint", help="OTLP/HTTP endpoint for spans and metrics (http://host:4318)"
    ),
    config: str = typer.Option(None, "--config", help="TOML configuration file"),
) -> None:
    """Run the node agent: ship the local ranks' records to the store until SIGTERM/SIGINT.
    Unset flags come from the configuration file, then the environment (ranksight config show)."""
    from ranksight.agent import AgentConfig
    from ranksight.agent.command import open_agent, serve
    from ranksight.agent.commands import parse_collectors, start_collection
    from ranksight.store import StoreError
    from ranksight.trainer_hooks.config import default_spool_dir

    try:
        v = _agent_settings(ctx, config)
    except ValueError as e:
        _fail(str(e), 2)
    spool, store, interval, batch_rows = v["spool"], v["store"], v["interval"], v["batch_rows"]
    buffer_dir, buffer_mb, drop = v["buffer_dir"], v["buffer_mb"], v["drop"]
    stats_interval, collectors, stall_s = v["stats_interval"], v["collectors"], v["stall_s"]
    try:
        parse_collectors(collectors)  # a usage error before anything is opened
    except ValueError as e:
        _fail(f"--collectors: {e}", 2)
    _check_otlp_endpoint(ctx, v["otlp_endpoint"])
    _check_folder(ctx, "spool", spool or default_spool_dir(), "the folder the ranks write to")
    if buffer_dir:
        _check_folder(ctx, "buffer_dir", buffer_dir, "the folder of batches not yet stored")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s ranksight-agent %(message)s")
    try:
        cfg = AgentConfig(
            interval_s=interval, batch_rows=batch_rows, buffer_dir=buffer_dir,
            buffer_bytes=buffer_mb << 20, drop_policy=drop, stats_interval_s=stats_interval,
            keep_spool=keep_spool,
        )  # fmt: skip
        a = open_agent(spool or default_spool_dir(), store, cfg)
    except ValueError as e:
        _fail(str(e), 2)
    except (StoreError, RuntimeError, OSError) as e:
        _fail(str(e))
    if once:
        otel = _otel_export(a, v["otlp_endpoint"])
        n = a.drain()
        console.print(
            f"read {counted(a.stats.accepted, 'record')} from the spool "
            f"({a.stats.rejected} rejected) and stored {counted(n, 'row')}"
            + (" (its own agent_stats included)" if stats_interval > 0 else "")
        )
        if otel is not None:
            flushed = otel.force_flush()
            otel.shutdown()
            if not flushed:
                _fail(
                    "the OTLP export did not finish in 10 s (see the log for the exporter's errors)"
                )
        if a.stats.store_errors:
            _fail(
                f"the store did not take everything ({a.stats.last_error}); what was not "
                "stored stays in the disk buffer for the next run"
            )
        return
    try:
        collection = start_collection(a.store, spool or default_spool_dir(), collectors, stall_s)
    except ValueError as e:
        _fail(f"--collectors/--stall-s: {e}", 2)
    otel = _otel_export(a, v["otlp_endpoint"])
    serve(a)
    if collection is not None:
        collection.stop()
    if otel is not None:
        otel.shutdown()


_AGENT_SETTINGS = {
    "spool": "agent.spool", "store": "store.url", "interval": "agent.interval_s",
    "batch_rows": "agent.batch_rows", "buffer_dir": "agent.buffer_dir", "buffer_mb": "agent.buffer_mb",
    "drop": "agent.drop", "stats_interval": "agent.stats_interval_s", "collectors": "agent.collectors",
    "stall_s": "agent.stall_s", "otlp_endpoint": "agent.otlp_endpoint",
}  # fmt: skip


def _agent_settings(ctx: typer.Context, config: str | None) -> dict:
    """The agent's options: flags given, else the configuration in force. A store URL
    from ``$RANKSIGHT_STORE`` stays in the environment (it may hold a password, which is
    refused on command lines only). Raises ConfigError (a ValueError)."""
    import os

    from ranksight import env
    from ranksight.settings import from_context

    v = from_context(ctx, config, _AGENT_SETTINGS)
    if v["store"] is not None and v["store"] == os.environ.get(env.STORE):
        v["store"] = None
    return v


def _check_folder(ctx: typer.Context, param: str, path: str, what: str) -> None:
    """Exit 2 naming the option (or the setting it came from) if ``path`` cannot be a
    folder (:func:`ranksight.folders.folder_problem`); ``what`` says what it is."""
    from ranksight.folders import folder_problem

    problem = folder_problem(path)
    if problem:
        _fail(f"{_agent_option(ctx, param)} {path}: {problem} (it must be {what})", 2)


def _agent_option(ctx: typer.Context, param: str) -> str:
    """How an error names an agent option: its flag where it was given on the command
    line, else the setting it came from (configuration file or environment)."""
    given = getattr(ctx.get_parameter_source(param), "name", "") == "COMMANDLINE"
    return "--" + param.replace("_", "-") if given else f"setting {_AGENT_SETTINGS[param]}"


def _check_otlp_endpoint(ctx: typer.Context, endpoint: str | None) -> None:
    """Exit 2 naming the option or variable if the OTLP endpoint in force (the option,
    else ``$OTEL_EXPORTER_OTLP_ENDPOINT``) is not one the exporter can send to."""
    where = _agent_option(ctx, "otlp_endpoint")
    if not endpoint:
        endpoint, where = (
            os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"),
            "$OTEL_EXPORTER_OTLP_ENDPOINT",
        )
    if not endpoint:
        return
    from ranksight.agent.otel import check_endpoint

    try:
        check_endpoint(endpoint)
    except ValueError as e:
        _fail(f"{where} {e}", 2)


def _otel_export(agent, endpoint: str | None):
    """An OtelExport watching ``agent`` for ``endpoint`` (else
    ``$OTEL_EXPORTER_OTLP_ENDPOINT``), or None when neither is set."""
    import os

    endpoint = endpoint or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    if not endpoint:
        return None
    from ranksight.agent.otel import OtelExport

    export = OtelExport(endpoint)
    export.watch(agent)
    agent.taps.append(export.tap)
    logging.getLogger("ranksight.agent").info("OpenTelemetry export to %s", endpoint)
    return export


def _register_extra_commands() -> None:
    from ranksight.synth_cli import synth

    app.command("synth")(synth)

    from ranksight.faultmatrix_cli import faultmatrix

    app.command("faultmatrix")(faultmatrix)

    from ranksight.ui.command import ui

    app.command("ui")(ui)

    from ranksight.store.command import db

    app.add_typer(db, name="db")

    from ranksight.agent.commands import fr_import, stacks

    app.command("stacks")(stacks)
    app.command("fr-import")(fr_import)

    from ranksight.config_cli import config
    from ranksight.launch_cli import launch

    app.command("launch")(launch)
    app.add_typer(config, name="config")

    from ranksight.importer.command import import_cmd

    app.command("import")(import_cmd)


_register_extra_commands()


def _stdout_closed(exc: BaseException) -> bool:
    """Whether ``exc`` ends the command because stdout's reader went away: an EPIPE
    write error, or the exit typer (on EPIPE) or rich (on BrokenPipeError) makes of one,
    which carries it as its context."""
    return any(isinstance(e, OSError) and e.errno == errno.EPIPE for e in (exc, exc.__context__))


def _usage_errors() -> tuple[type[BaseException], ...]:
    """The exception classes of a usage error: typer's own (0.2x carries its own click)
    and click's, where click is installed."""
    kinds: list[type[BaseException]] = [typer.TyperException]
    try:
        import click

        kinds.append(click.ClickException)
    except ImportError:
        pass
    return tuple(kinds)


def _run_app() -> int:
    """Run the command; a usage error (a bad or missing option, a value of the wrong
    type, an unknown command) is one line on stderr and its exit code (2), as every other
    error of ours is one line, not a boxed usage text."""
    try:
        code = app(standalone_mode=False)
    except _usage_errors() as e:
        where = getattr(e, "ctx", None)
        if type(e).__name__ == "NoArgsIsHelpError" and where is not None:
            print(where.get_help())
            return 0
        hint = f" (see '{where.command_path} --help')" if where is not None else ""
        message = e.format_message() if hasattr(e, "format_message") else str(e)
        err.print(f"[red]error:[/] {escape(message + hint)}", highlight=False)
        return int(getattr(e, "exit_code", 2))
    except typer.Abort:
        return 130
    return code if isinstance(code, int) else 0


def main() -> None:
    """Console-script entry point. A closed stdout (``| head``) ends any command quietly
    with exit 141 (128 + SIGPIPE, what git and coreutils report), not a traceback or 1."""
    try:
        try:
            sys.exit(_run_app())
        finally:
            sys.stdout.flush()  # what print() left buffered fails here, not at exit
    except KeyboardInterrupt:
        sys.exit(130)
    except (SystemExit, OSError) as e:
        if not _stdout_closed(e):
            raise
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing left to fail
        sys.exit(141)


if __name__ == "__main__":
    main()
