"""The ``ranksight`` command: a thin layer over the library APIs, one module a subcommand
(registered in :data:`COMMANDS` and :data:`GROUPS`), what they share in :mod:`.common`.

Exit codes: 0 ok / no culprit, 3 a culprit was found (``report``, ``demo``), 1 an error
(bad store, unknown run, failed job), 2 a usage error, 141 stdout was closed before all was
printed (``ranksight report ... | head``; quiet, as git and coreutils end on SIGPIPE).
"""

from __future__ import annotations

import errno
import os
import sys

import typer
from rich.markup import escape

from . import (
    agent,
    config,
    db,
    demo,
    faultmatrix,
    fr_import,
    import_cmd,
    launch,
    report,
    runs,
    stacks,
    synth,
    ui,
)
from .common import err

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Find the slow rank, the slow link and the stuck rank of a distributed PyTorch job,"
    " say why, and what it costs. Exit codes: 0 ok or no culprit, 3 a culprit found"
    " (report, demo, import), 1 an error, 2 a usage error.",
)

COMMANDS = (
    ("demo", demo.demo), ("report", report.report), ("runs", runs.runs), ("agent", agent.agent),
    ("synth", synth.synth), ("faultmatrix", faultmatrix.faultmatrix), ("ui", ui.ui),
    ("stacks", stacks.stacks), ("fr-import", fr_import.fr_import), ("launch", launch.launch),
    ("import", import_cmd.import_cmd),
)  # fmt: skip
"""Every subcommand (name, function), in the order ``ranksight --help`` lists them."""
GROUPS = (("db", db.db), ("config", config.config))
"""Every subcommand with subcommands of its own (name, typer app), listed after COMMANDS."""


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

    setattr(TyperOption, "display_type_rich", display_type_rich)  # noqa: B010 - typer 0.29+ only


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


def _register() -> None:
    for name, command in COMMANDS:
        app.command(name)(command)
    for name, group in GROUPS:
        app.add_typer(group, name=name)


_flags_show_no_type()
_register()


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
        err.print(f"[red]error:[/] {escape(message + hint)}", highlight=False, emoji=False)
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
