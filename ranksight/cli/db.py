"""``ranksight db``: the store's schema version and migration."""

from __future__ import annotations

import typer

from ranksight.cli.common import STORE_OPTION, fail
from ranksight.ground.words import counted
from ranksight.store import StoreError, open_store
from ranksight.store.migrate import migrate, plan_migration
from ranksight.store.schema import SCHEMA_VERSION
from ranksight.store.url import default_store_url, refuse_password

db = typer.Typer(no_args_is_help=True, help="The store's schema: version and migration.")


@db.command("migrate")
def migrate_command(
    store: str = STORE_OPTION,
    dry_run: bool = typer.Option(
        False, "--dry-run", help="print what would be done, change nothing"
    ),
) -> None:
    """Bring the store's tables up to this ranksight's schema (additions only)."""
    try:
        refuse_password(store)
        s = open_store(store or default_store_url())
        s.prepare()
        plan = plan_migration(s) if dry_run else migrate(s)
    except StoreError as exc:
        fail(str(exc))
    typer.echo(
        plan.describe() if plan.needed else f"{plan.url}: up to date (version {plan.found_version})"
    )
    if plan.needed and not dry_run:
        typer.echo("done")


@db.command("init")
def init_command(
    store: str = STORE_OPTION,
    cluster: str = typer.Option(
        None,
        "--cluster",
        help="a cluster of the server's <remote_servers>: local tables on every node, "
        "Distributed tables on top (see deploy/clickhouse/cluster/)",
    ),
    replicated: bool = typer.Option(
        None,
        "--replicated/--no-replicated",
        help="ReplicatedMergeTree local tables (needs ZooKeeper/Keeper); default: when a "
        "shard has several replicas",
    ),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="print what would be done, change nothing"
    ),
) -> None:
    """Create the store's tables (on every node of --cluster), or add what is missing."""
    from ranksight.store.cluster import init_cluster
    from ranksight.store.ddl import check_identifier

    try:
        refuse_password(store)
        s = open_store(store or default_store_url())
        if cluster is None:
            s.prepare()
            plan = plan_migration(s) if dry_run else migrate(s)
            typer.echo(
                plan.describe()
                if plan.needed
                else f"{plan.url}: up to date (version {plan.found_version})"
            )
            return
        check_identifier(cluster)
        if not hasattr(s, "sibling"):
            raise StoreError(f"{s.url}: --cluster needs a ClickHouse server store (clickhouse://)")
        done = init_cluster(s, cluster, replicated, dry_run=dry_run)
    except ValueError as exc:
        fail(f"--cluster: {exc}", 2)
    except StoreError as exc:
        fail(str(exc))
    typer.echo(done.describe())
    if not dry_run:
        typer.echo(
            f"done: {counted(len(done.statements), 'node')} at schema version {SCHEMA_VERSION}"
        )
