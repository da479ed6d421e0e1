"""``ranksight ui``: start the web UI (``ui/launch.py``) on a store."""

from __future__ import annotations

import typer

from ranksight.cli.common import STORE_OPTION, check_readable, console, err, fail
from ranksight.store.url import default_store_url, redact


def ui(
    store: str = STORE_OPTION,
    host: str = typer.Option("127.0.0.1", help="address to bind (default loopback only)"),
    port: int = typer.Option(8501, help="TCP port"),
    run: str = typer.Option(None, "--run", help="print the URL of this run's overview"),
) -> None:
    """Start the web UI (Streamlit) on the store: runs, heatmaps, timelines, mesh, hangs, hosts."""
    from ranksight.store import StoreError, open_store
    from ranksight.store.url import missing_store, refuse_password
    from ranksight.ui.launch import LaunchConfig, page_url, port_taken, serve

    url = store or default_store_url()
    try:
        refuse_password(store)
        cfg = LaunchConfig(store=url, host=host, port=port, run=run)
        opened = open_store(url)  # a bad URL or an unreachable server fails here, not in the page
        absent = missing_store(opened, url)
        if not absent:
            check_readable(opened)  # an older schema: say so here, not in every page
        opened.close()
    except ValueError as e:
        fail(str(e), 2)
    except StoreError as e:
        fail(str(e))
    if absent:
        fail(absent)
    if taken := port_taken(cfg):
        fail(taken)
    console.print(f"ranksight UI on {page_url(cfg)} reading {redact(url)} (Ctrl-C stops it)")
    if run:
        console.print(f"run {run}: {page_url(cfg, page='overview', run=run)}")
    if host not in ("127.0.0.1", "localhost", "::1"):
        err.print(
            f"[yellow]warning:[/] bound to {host}: anyone who can reach this address can read the store"
        )
    raise typer.Exit(serve(cfg))
