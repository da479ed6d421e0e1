"""The ``ranksight ui`` subcommand (registered in ``ranksight/cli.py``)."""

from __future__ import annotations

import typer
from rich.console import Console
from rich.markup import escape

from ranksight.store.url import default_store_url, redact


def ui(
    store: str = typer.Option(
        None,
        "--store",
        help="store URL: a folder (chdb) or clickhouse://host:port/db; default $RANKSIGHT_STORE or ./.ranksight/store",
    ),
    host: str = typer.Option("127.0.0.1", help="address to bind (default loopback only)"),
    port: int = typer.Option(8501, help="TCP port"),
    run: str = typer.Option(None, "--run", help="print the URL of this run's overview"),
) -> None:
    """Start the web UI (Streamlit) on the store: runs, heatmaps, timelines, mesh, hangs, hosts."""
    from ranksight.store import StoreError, open_store
    from ranksight.store.url import missing_store, refuse_password
    from ranksight.ui.launch import LaunchConfig, page_url, port_taken, serve

    out, err = Console(), Console(stderr=True, soft_wrap=True)
    url = store or default_store_url()
    try:
        refuse_password(store)
        cfg = LaunchConfig(store=url, host=host, port=port, run=run)
        store = open_store(url)  # a bad URL or an unreachable server fails here, not in the page
        absent = missing_store(store, url)
        store.close()
    except ValueError as e:
        err.print(f"[red]error:[/] {escape(str(e))}")
        raise typer.Exit(2) from None
    except StoreError as e:
        err.print(f"[red]error:[/] {escape(str(e))}")
        raise typer.Exit(1) from None
    if absent:
        err.print(f"[red]error:[/] {escape(absent)}")
        raise typer.Exit(1)
    if taken := port_taken(cfg):
        err.print(f"[red]error:[/] {escape(taken)}")
        raise typer.Exit(1)
    out.print(f"ranksight UI on {page_url(cfg)} reading {redact(url)} (Ctrl-C stops it)")
    if run:
        out.print(f"run {run}: {page_url(cfg, page='overview', run=run)}")
    if host not in ("127.0.0.1", "localhost", "::1"):
        err.print(
            f"[yellow]warning:[/] bound to {host}: anyone who can reach this address can read the store"
        )
    raise typer.Exit(serve(cfg))
