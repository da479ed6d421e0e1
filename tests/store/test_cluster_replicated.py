"""Replication for real: Debian's ZooKeeper and two clickhouse-server 18.16 processes as two
replicas of one shard; ReplicatedMergeTree local tables made by ``init_cluster``; rows
written through one replica's Distributed table are read from the other's local table,
and reads keep working with one replica down."""

from __future__ import annotations

import time

import pandas as pd
import pytest

from ranksight.store import open_store
from ranksight.store.cluster import init_cluster
from ranksight.store.local_cluster import start_local_cluster

pytestmark = pytest.mark.clickhouse


@pytest.fixture(scope="module")
def replicated(tmp_path_factory):
    with start_local_cluster(tmp_path_factory.mktemp("replicated"), shards=1, replicas=2) as c:
        yield c


def _steps(run_id: str, n: int) -> pd.DataFrame:
    t0 = time.time_ns()
    return pd.DataFrame(
        {
            "run_id": run_id,
            "attempt": 0,
            "rank": [i % 4 for i in range(n)],
            "step": [i // 4 for i in range(n)],
            "start_ns": [t0 + i for i in range(n)],
            "end_ns": [t0 + i + 1000 for i in range(n)],
        }  # fmt: skip
    )


def _count(store, table: str, run_id: str) -> int:
    got = store.query(f"SELECT count() AS n FROM {table} WHERE run_id = %(r)s", {"r": run_id})
    return int(got["n"].iloc[0])


def test_replicated_tables_copy_rows_to_the_other_replica(replicated):
    with open_store(replicated.url(1, 1)) as store:
        done = init_cluster(store, "ranksight")
        assert done.replicated and len(done.statements) == 2
        engines = store.query(
            "SELECT name, engine FROM system.tables WHERE database = 'ranksight' AND name = 'steps_local'"
        )
        assert engines["engine"].tolist() == ["ReplicatedMergeTree"]
        assert store.insert("steps", _steps("rep-1", 400), batch_id=7) == 400
    with open_store(replicated.url(1, 2)) as other:
        deadline = time.monotonic() + 30
        while _count(other, "steps_local", "rep-1") < 400 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _count(other, "steps_local", "rep-1") == 400
        assert other.stored_batches("steps", [7]) == {7: 400}
    replicated.server(1, 1).stop()
    with open_store(replicated.url(1, 2)) as other:
        assert _count(other, "steps", "rep-1") == 400  # the Distributed read skips the dead replica
