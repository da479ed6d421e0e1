"""Idempotent delivery on both backends (chdb, ClickHouse 18.16), and schema migration.

The "timeout after the server wrote it" case: the store really takes the insert, then the
call raises as a timed-out one would; the agent must retry without storing it twice.
"""

from __future__ import annotations

import pandas as pd
import pytest

from ranksight.agent import Agent, AgentConfig
from ranksight.agent.deliver import pieces
from ranksight.store import StoreError, open_store, schema
from ranksight.store.ddl import create_database_sql, create_table_sql
from ranksight.store.migrate import plan_migration

T0 = 1_700_000_000_000_000_000  # 2023-11-14
DAY = 86_400 * 10**9


class LandsThenFails:
    """Wraps a store: the first ``n`` batch inserts are written, then raise."""

    def __init__(self, store, n: int = 1) -> None:
        self.store, self.left, self.calls = store, n, 0

    def __getattr__(self, name):
        return getattr(self.store, name)

    def insert(self, table, frame, *, batch_id=0):
        rows = self.store.insert(table, frame, batch_id=batch_id)
        self.calls += 1
        if batch_id and self.left > 0:
            self.left -= 1
            raise StoreError("timed out waiting for the server (simulated, after it wrote)")
        return rows


def run_agent(store, tmp_path) -> Agent:
    return Agent(str(tmp_path / "spool"), store, config=AgentConfig(stats_interval_s=0))


def steps_frame(n: int, start_ns: int = T0) -> pd.DataFrame:
    return pd.DataFrame({"run_id": "d", "step": range(n), "start_ns": start_ns + pd.RangeIndex(n)})


def counts(store) -> tuple[int, int]:
    row = store.query("SELECT count() AS n, uniqExact(step) AS u FROM steps").iloc[0]
    return int(row["n"]), int(row["u"])


def test_a_batch_that_landed_before_its_insert_failed_is_not_stored_twice(store, tmp_path):
    flaky = LandsThenFails(store)
    agent = run_agent(flaky, tmp_path)
    agent.submit("steps", steps_frame(1000))
    agent.submit("phases", pd.DataFrame({"run_id": "d", "step": [1, 2], "start_ns": T0}))
    assert agent.poll_once() == 0 and agent.stats.store_errors == 1
    assert agent.drain() == 1002
    assert counts(store) == (1000, 1000)
    assert store.query("SELECT count() AS n FROM phases")["n"].tolist() == [2]
    assert (
        agent.stats.already_stored >= 1000
        and agent.stats.shipped + agent.stats.already_stored == 1002
    )


def test_a_retry_after_an_agent_restart_is_checked_against_the_store(store, tmp_path):
    agent = run_agent(LandsThenFails(store), tmp_path)
    agent.submit("steps", steps_frame(300))
    agent.poll_once()  # landed, but the agent thinks it failed ... and then it dies
    agent.close()
    again = run_agent(store, tmp_path)  # the batch is still buffered, marked attempted
    assert again.drain() == 300 and again.stats.already_stored == 300
    assert counts(store) == (300, 300)


def test_a_batch_over_two_months_is_two_pieces_each_stored_once(store, tmp_path):
    frame = pd.concat(
        [steps_frame(50, T0), steps_frame(50, T0 + 20 * DAY).assign(step=range(50, 100))]
    )
    import pyarrow as pa

    parts = pieces(store, "steps", 42, pa.Table.from_pandas(frame, preserve_index=False))
    server = "clickhouse" in store.url
    assert len(parts) == (2 if server else 1), "the server partitions by month; chdb does not"
    agent = run_agent(LandsThenFails(store), tmp_path)
    agent.submit("steps", frame)
    agent.drain()
    agent.drain()
    assert counts(store) == (100, 100)
    ids = store.query("SELECT uniqExact(batch_id) AS n, min(batch_id) AS lo FROM steps").iloc[0]
    assert int(ids["n"]) == len(parts) and int(ids["lo"]) > 0


def test_chdb_compaction_between_attempts_does_not_let_a_batch_in_twice(chdb_url, tmp_path):
    store = open_store(chdb_url)
    store.init_schema()
    agent = run_agent(LandsThenFails(store), tmp_path)
    agent.submit("steps", steps_frame(200))
    agent.poll_once()
    assert store.compact("steps") > 0  # the batch's named segment is merged away
    assert agent.drain() == 200 and counts(store) == (200, 200)


NEW_IN_5 = ("grad_norm", "gpu_mem_allocated_bytes", "gpu_mem_reserved_bytes")


def test_an_older_server_schema_is_migrated_and_its_rows_kept(clickhouse_db_url):
    store = open_store(clickhouse_db_url)
    db = clickhouse_db_url.rsplit("/", 1)[1]
    old_steps = schema.Table(
        "steps",
        tuple(c for c in schema.STEPS.columns if c[0] not in ("batch_id", *NEW_IN_5)),
        schema.STEPS.order_by,
        schema.STEPS.time_column,
    )
    client = store._admin
    client.execute(create_database_sql(db))
    client.execute(create_table_sql(old_steps, db))
    client.execute(create_table_sql(schema.SCHEMA_VERSION_TABLE, db))
    client.execute(f"INSERT INTO {db}.steps (run_id, step) SELECT 'old', 1")
    client.execute(f"INSERT INTO {db}.schema_version SELECT 1, {T0}")
    plan = plan_migration(store)
    assert any("ADD COLUMN grad_norm Float64 AFTER rss_bytes" in s for s in plan.statements)
    assert any(
        "ADD COLUMN batch_id UInt64 AFTER gpu_mem_reserved_bytes" in s for s in plan.statements
    )
    assert any("CREATE TABLE" in s and ".runs" in s for s in plan.statements)
    store.init_schema()
    assert plan_migration(store).statements == ()
    got = store.query("SELECT run_id, step, batch_id, gpu_mem_reserved_bytes FROM steps")
    assert got.to_dict("records") == [
        {"run_id": "old", "step": 1, "batch_id": 0, "gpu_mem_reserved_bytes": 0}
    ]
    store.insert("steps", steps_frame(3), batch_id=9)
    assert store.stored_batches("steps", [9, 10]) == {9: 3}


def test_a_column_of_another_type_is_refused_with_what_to_do(clickhouse_db_url):
    store = open_store(clickhouse_db_url)
    db = clickhouse_db_url.rsplit("/", 1)[1]
    store._admin.execute(create_database_sql(db))
    changed = schema.Table("steps", (("run_id", "String"), ("step", "Int64")), ("run_id",))
    store._admin.execute(create_table_sql(changed, db))
    with pytest.raises(
        StoreError, match="steps.step is Int64 in the store but UInt32.*MODIFY COLUMN"
    ):
        store.init_schema()


def test_old_chdb_segments_read_the_new_column_as_zero(chdb_url):
    import pyarrow as pa
    import pyarrow.parquet as pq

    store = open_store(chdb_url)
    store.init_schema()
    old = pa.table({"run_id": ["old"], "step": pa.array([4], pa.uint32())})
    pq.write_table(old, f"{store.folder}/steps/0-old.parquet")
    got = store.query("SELECT run_id, step, batch_id FROM steps")
    assert got.to_dict("records") == [{"run_id": "old", "step": 4, "batch_id": 0}]
    assert plan_migration(store).statements == ()
