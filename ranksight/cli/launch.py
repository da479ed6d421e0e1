"""``ranksight launch``: the CLI over ``ranksight/launcher/__init__.py``."""

from __future__ import annotations

import typer

from ranksight.cli.common import STORE_OPTION, err, fail


def launch(
    command: list[str] = typer.Argument(
        ...,
        help="the launcher command, after '--': torchrun ... / python -m torch.distributed.run ...",
    ),
    run_id: str = typer.Option(
        None, "--run-id", help="run id (default $RANKSIGHT_RUN_ID, torchrun's --rdzv-id, or new)"
    ),
    store: str = STORE_OPTION,
    spool: str = typer.Option(None, "--spool", help="node-local spool folder"),
    level: str = typer.Option(None, "--level", help="hook level: off, default or detailed"),
    auto_attach: bool = typer.Option(
        None, "--auto-attach/--no-auto-attach", help="attach the hooks without code changes"
    ),
    mesh: str = typer.Option(
        None, "--mesh", help="mesh shape for auto-attach, e.g. dp=2,pp=2,tp=2"
    ),
    agent: str = typer.Option(
        None, "--agent", help="auto (reuse or start the node agent) or never"
    ),
    grace_s: float = typer.Option(
        None, "--grace-s", help="seconds from SIGTERM to SIGKILL of the job"
    ),
    config: str = typer.Option(None, "--config", help="TOML configuration file"),
) -> None:
    """Run a training job with ranksight on: agent, hooks, run status (ranksight launch -- torchrun ...)."""
    from ranksight.cli.settings import ConfigError, load_settings
    from ranksight.launcher import LaunchConfig, run_launch
    from ranksight.store.url import redact, refuse_password

    flags = {"store.url": store, "launch.spool": spool, "launch.level": level,
             "launch.auto_attach": auto_attach, "launch.mesh": mesh, "launch.agent": agent,
             "launch.grace_s": grace_s}  # fmt: skip
    try:
        refuse_password(store)
        s = load_settings(config, flags)
        cfg = LaunchConfig(
            command=tuple(command), run_id=run_id, store=s["store.url"], spool=s["launch.spool"],
            level=s["launch.level"], auto_attach=s["launch.auto_attach"], mesh=s["launch.mesh"],
            agent=s["launch.agent"], grace_s=s["launch.grace_s"],
        )  # fmt: skip
        code = run_launch(cfg, say=lambda line: err.print(line, markup=False, highlight=False))
    except (ConfigError, ValueError) as exc:
        fail(redact(str(exc)), 2)
    except Exception as exc:  # StoreError for a bad URL
        fail(redact(str(exc)))
    raise typer.Exit(code)
