"""What every ``ranksight`` subcommand shares: the consoles, the one-line error exit, the
``--store`` option and opening the store it names."""

from __future__ import annotations

import typer
from rich.console import Console
from rich.markup import escape

console = Console()
err = Console(stderr=True, soft_wrap=True)  # one error, one line

STORE_OPTION = typer.Option(
    None,
    "--store",
    help="store URL: a folder (chdb) or clickhouse://host:port/db; default $RANKSIGHT_STORE or ./.ranksight/store",
)
"""The ``--store`` option of every subcommand that reads or writes the store."""


def fail(message: str, code: int = 1) -> None:
    """Print ``error: message`` on stderr (text, never read as markup or emoji codes: it
    may quote a job's log or a path) and exit with ``code``. Raises typer.Exit."""
    err.print(f"[red]error:[/] {escape(message)}", emoji=False)
    raise typer.Exit(code)


def open_store_arg(url: str | None, must_exist: bool = False):
    """The store ``--store`` names (None: :func:`ranksight.store.url.default_store_url`).

    A writer (the default) gets it with its schema brought up to date (created if new).
    ``must_exist`` (the commands that only read): nothing is written and the schema is
    not migrated. A chdb folder that is not there is an error, not a new empty store made
    at a mistyped path, and so is a store whose schema is older than this ranksight's,
    naming the store and ``ranksight db migrate``. Exits 1 (:func:`fail`) for a password
    in the URL, a bad URL or a store that cannot be opened or read."""
    from ranksight.store import StoreError, open_store
    from ranksight.store.url import default_store_url, missing_store, refuse_password

    try:
        refuse_password(url)
        store = open_store(url or default_store_url())
        if must_exist:
            if absent := missing_store(store, url):
                fail(absent)
            check_readable(store)
        else:
            store.init_schema()
        return store
    except StoreError as e:
        fail(str(e))
    except ValueError as e:
        fail(f"bad --store {url!r}: {e}")


def check_readable(store) -> None:
    """Raise StoreError unless ``store`` is at this ranksight's schema version: a newer
    one names both versions; an older one (or one with no version: not a store made by
    ``ranksight``) names the store and ``ranksight db migrate --store URL``, which a
    reader does not run for the user (it changes the store)."""
    from ranksight.store import StoreError
    from ranksight.store.schema import SCHEMA_VERSION

    folder = getattr(store, "folder", None)  # a chdb folder with no version table: 0
    bare = folder is not None and not (folder / "schema_version").is_dir()
    found = 0 if bare else store.check_schema_version()
    if found < SCHEMA_VERSION:
        raise StoreError(
            f"{store.url}: store has schema version {found}, older than this ranksight's "
            f"{SCHEMA_VERSION}; run 'ranksight db migrate --store {store.url}' to bring it "
            "up to date (reading commands do not change the store)"
        )


def analysis_run(store, run_id: str, attempt: int) -> dict:
    """The run's row (status, mesh, meta) for the report headline. Raises UnknownRun (a
    StoreError) for a run or attempt not in the store."""
    from ranksight.analyzer.queries import resolve_attempt

    return resolve_attempt(store, run_id, attempt)[0]
