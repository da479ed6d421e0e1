"""Schema versions: bring an older store up to this ranksight's tables, refuse a newer one.

The store records the version it was last brought to in its ``schema_version`` table.
Opening it (``Store.init_schema``, which every writer and the CLI's readers call):

- a store newer than :data:`~ranksight.store.schema.SCHEMA_VERSION` is refused with a
  StoreError naming both versions (this code may not understand its tables);
- otherwise the store's tables are compared with ``schema.TABLES``, and what is missing
  is added: tables are created, columns are added (``ALTER TABLE ... ADD COLUMN ... AFTER``
  on the server: a metadata change, old rows read the column's default; chdb's Parquet
  segments need nothing, a missing column reads as its default). Only additions are
  automatic. A column whose type differs is an error naming it.
- if the store cannot be changed (a read-only user), the StoreError says exactly what to
  run: ``ranksight db migrate --store URL`` and the statements themselves.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ranksight.store import schema
from ranksight.store.errors import StoreError

if TYPE_CHECKING:
    from ranksight.store.base import Store


@dataclass(frozen=True, slots=True)
class MigrationPlan:
    """What :func:`migrate` does to a store: the version it holds, the version it gets and
    the statements (server SQL, or folder actions on chdb) that take it there."""

    url: str
    found_version: int
    target_version: int
    statements: tuple[str, ...]

    @property
    def needed(self) -> bool:
        """Whether anything is to be done (statements, or a version to record)."""
        return bool(self.statements) or self.found_version < self.target_version

    def describe(self) -> str:
        """One line per statement, after a line naming the versions."""
        head = f"{self.url}: schema version {self.found_version} -> {self.target_version}"
        return "\n".join([head, *self.statements])


def plan_migration(store: Store) -> MigrationPlan:
    """The :class:`MigrationPlan` for ``store``. Raises StoreError if the store's schema
    version is newer than this code's, if a column has another type than ours, or if the
    store cannot be read."""
    found = store.check_schema_version()
    statements = tuple(store.schema_changes())
    return MigrationPlan(store.url, found, schema.SCHEMA_VERSION, statements)


def migrate(store: Store) -> MigrationPlan:
    """Apply :func:`plan_migration` and record the new version; returns the plan applied.
    Raises StoreError naming the command and statements to run by hand if the store
    refuses a change (e.g. a read-only user)."""
    plan = plan_migration(store)
    if not plan.needed:
        return plan
    try:
        store.apply_schema_changes(plan.statements)
        if plan.found_version < plan.target_version:
            store.record_schema_version(plan.target_version)
    except StoreError as exc:
        raise StoreError(
            f"{plan.url}: cannot migrate the schema from version {plan.found_version} to "
            f"{plan.target_version} ({exc}); run `ranksight db migrate --store URL` as a user "
            f"who may change it, or these statements: {'; '.join(plan.statements) or '-'}"
        ) from None
    return plan


def type_mismatch(table: str, column: str, found: str, wanted: str) -> StoreError:
    """The error for a column whose stored type differs from ours."""
    return StoreError(
        f"column {table}.{column} is {found} in the store but {wanted} in this ranksight's "
        "schema: no automatic migration; convert it by hand (ALTER TABLE ... MODIFY COLUMN) "
        "or use a new database"
    )
