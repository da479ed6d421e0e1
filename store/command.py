"""``ranksight db``: the store's schema version and migration."""

from __future__ import annotations

import typer

from ranksight.store import StoreError, open_store
from ranksight.store.migrate import migrate, plan_migration
from ranksight.store.url import default_store_url, refuse_password

db = typer.Typer(no_args_is_help=True, help="The store's schema: version and migration.")


@db.command("migrate")
def migrate_command(
    store: str = typer.Option(
        None, "--store", help="store URL (default $RANKSIGHT_STORE or ./.ranksight/store)"
    ),
    dry_run: bool = typer.Option(False, help="print what would be done, change nothing"),
) -> None:
    """Bring the store's tables up to this ranksight's schema (additions only)."""
    try:
        refuse_password(store)
        s = open_store(store or default_store_url())
        s.prepare()
        plan = plan_migration(s) if dry_run else migrate(s)
    except StoreError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    typer.echo(
        plan.describe() if plan.needed else f"{plan.url}: up to date (version {plan.found_version})"
    )
    if plan.needed and not dry_run:
        typer.echo("done")
