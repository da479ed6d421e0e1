"""``ranksight agent``: run the node agent (``ranksight/agent/``), its settings from flags,
the configuration file and the environment, its collectors and its OpenTelemetry export."""

from __future__ import annotations

import logging
import os

import typer

from ranksight.cli.common import STORE_OPTION, console, fail
from ranksight.ground.words import counted
from ranksight.store.base import MAX_ATOMIC_ROWS


def agent(
    ctx: typer.Context,
    spool: str = typer.Option(
        None, help="spool folder the ranks write to (default $RANKSIGHT_SPOOL_DIR)"
    ),
    store: str = STORE_OPTION,
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
        help="node collectors: default, none, or some of nvml,xid,topology,rdma,netdev,host,pressure,fr,stacks,postmortem",
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
    from ranksight.agent.collect import parse_collectors
    from ranksight.agent.collection import start_collection
    from ranksight.agent.command import open_agent, serve
    from ranksight.store import StoreError
    from ranksight.trainer_hooks.config import default_spool_dir

    try:
        v = _agent_settings(ctx, config)
    except ValueError as e:
        fail(str(e), 2)
    spool, store, interval, batch_rows = v["spool"], v["store"], v["interval"], v["batch_rows"]
    buffer_dir, buffer_mb, drop = v["buffer_dir"], v["buffer_mb"], v["drop"]
    stats_interval, collectors, stall_s = v["stats_interval"], v["collectors"], v["stall_s"]
    try:
        parse_collectors(collectors)  # a usage error before anything is opened
    except ValueError as e:
        fail(f"--collectors: {e}", 2)
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
        fail(str(e), 2)
    except (StoreError, RuntimeError, OSError) as e:
        fail(str(e))
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
                fail(
                    "the OTLP export did not finish in 10 s (see the log for the exporter's errors)"
                )
        if a.stats.store_errors:
            fail(
                f"the store did not take everything ({a.stats.last_error}); what was not "
                "stored stays in the disk buffer for the next run"
            )
        return
    try:
        collection = start_collection(a.store, spool or default_spool_dir(), collectors, stall_s)
    except ValueError as e:
        fail(f"--collectors/--stall-s: {e}", 2)
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
    from ranksight.cli.settings import from_context
    from ranksight.ground import env

    v = from_context(ctx, config, _AGENT_SETTINGS)
    if v["store"] is not None and v["store"] == os.environ.get(env.STORE):
        v["store"] = None
    return v


def _check_folder(ctx: typer.Context, param: str, path: str, what: str) -> None:
    """Exit 2 naming the option (or the setting it came from) if ``path`` cannot be a
    folder (:func:`ranksight.ground.folders.folder_problem`); ``what`` says what it is."""
    from ranksight.ground.folders import folder_problem

    problem = folder_problem(path)
    if problem:
        fail(f"{_agent_option(ctx, param)} {path}: {problem} (it must be {what})", 2)


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
        fail(f"{where} {e}", 2)


def _otel_export(agent, endpoint: str | None):
    """An OtelExport watching ``agent`` for ``endpoint`` (else
    ``$OTEL_EXPORTER_OTLP_ENDPOINT``), or None when neither is set."""
    endpoint = endpoint or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    if not endpoint:
        return None
    from ranksight.agent.otel import OtelExport

    export = OtelExport(endpoint)
    export.watch(agent)
    agent.taps.append(export.tap)
    logging.getLogger("ranksight.agent").info("OpenTelemetry export to %s", endpoint)
    return export
