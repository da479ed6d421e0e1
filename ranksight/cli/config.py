"""``ranksight config``: the configuration in force (``ranksight/cli/settings.py``)."""

from __future__ import annotations

import typer

config = typer.Typer(
    no_args_is_help=True, help="Configuration: TOML file, env defaults, flags win."
)


@config.command("show")
def show_command(
    path: str = typer.Option(
        None,
        "--config",
        help="TOML file (default $RANKSIGHT_CONFIG, ./ranksight.toml, /etc/ranksight/ranksight.toml)",
    ),
) -> None:
    """Print every setting with the value in force and where it came from."""
    from ranksight.cli.settings import ConfigError, show

    try:
        typer.echo(show(path), nl=False)
    except ConfigError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
