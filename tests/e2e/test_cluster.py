"""A ClickHouse cluster for real: two clickhouse-server 18.16 processes as two shards on
loopback ports, the cluster schema (local + Distributed tables) made by ``ranksight db
init --cluster``, the demo run against the Distributed tables, and the analyzer's
findings compared with a single server's on the same run's records."""

from __future__ import annotations

import os
import subprocess
import sys

import pandas as pd
import pytest
from clickhouse_driver import Client

from ranksight.analyzer import analyze
from ranksight.store import StoreError, open_store, schema
from ranksight.store.cluster import LOCAL_SUFFIX, distributed_tables, init_cluster
from ranksight.store.local_cluster import start_local_cluster
from ranksight.synthetic import SynthConfig, write_synthetic

pytestmark = pytest.mark.clickhouse
_COMPARED = ("kind", "cause", "culprit_rank", "host", "dp", "tp", "pp", "confidence",
             "impact_pct", "summary", "evidence")  # fmt: skip


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Two shards, one replica each, cluster ``ranksight`` in both servers' config."""
    with start_local_cluster(tmp_path_factory.mktemp("cluster"), shards=2) as c:
        yield c


def _cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ranksight.cli", *args],
        capture_output=True, text=True, timeout=600, env={**os.environ, **(env or {})},
    )  # fmt: skip


def _local_count(port: int, table: str, run_id: str | None = None) -> int:
    client = Client("127.0.0.1", port=port, database="ranksight")
    try:
        where = " WHERE run_id = %(r)s" if run_id else ""
        return client.execute(f"SELECT count() FROM {table}{LOCAL_SUFFIX}{where}", {"r": run_id})[
            0
        ][0]
    finally:
        client.disconnect()


def _findings(store, run_id: str) -> list[dict]:
    return [
        {k: getattr(f, k) for k in _COMPARED} for f in analyze(store, run_id, save=False).findings
    ]


def _copy_run(src, dst, run_id: str) -> int:
    """Every row of ``run_id`` in ``src``'s tables inserted into ``dst``; returns rows."""
    n = 0
    for table in schema.TABLES.values():
        if "run_id" not in table.column_names:
            continue
        cols = ", ".join(table.column_names)
        frame = src.query(f"SELECT {cols} FROM {table.name} WHERE run_id = %(r)s", {"r": run_id})
        if len(frame):
            n += dst.insert(table.name, frame)
    return n


def test_db_init_cluster_creates_local_and_distributed_tables_on_every_node(cluster):
    out = _cli("db", "init", "--cluster", "ranksight", "--store", cluster.url(1))
    assert out.returncode == 0, out.stderr
    assert "shard 2 replica 1" in out.stdout and "done: 2 nodes" in out.stdout
    for shard in (1, 2):
        with open_store(cluster.url(shard)) as store:
            engines = dict(
                store.query(
                    "SELECT name, engine FROM system.tables WHERE database = 'ranksight'"
                ).itertuples(index=False)
            )
            for table in distributed_tables():
                assert engines[table.name] == "Distributed", table.name
                assert engines[table.name + LOCAL_SUFFIX] == "MergeTree", table.name
            assert engines["schema_version"] == "MergeTree"
            assert store.schema_version() == schema.SCHEMA_VERSION
            store.init_schema()  # a reader's open: nothing to change, no error
    again = _cli("db", "init", "--cluster", "ranksight", "--store", cluster.url(2))
    assert again.returncode == 0 and again.stdout.count("up to date") == 2, again.stdout
    bad = _cli("db", "init", "--cluster", "nosuch", "--store", cluster.url(1))
    assert bad.returncode == 1 and "no cluster 'nosuch'" in bad.stderr and "ranksight" in bad.stderr


def test_missing_table_on_a_cluster_points_at_db_init(cluster, tmp_path):
    with open_store(cluster.url(1)) as store:
        init_cluster(store, "ranksight")
        store.run_ddl(["DROP TABLE ranksight.gpu_events"])
    with (
        open_store(cluster.url(1)) as store,
        pytest.raises(StoreError, match="db init --cluster ranksight"),
    ):
        store.init_schema()
    with open_store(cluster.url(1)) as store:
        done = init_cluster(store, "ranksight")
        assert sum(len(s) for s in done.statements.values()) == 1  # the dropped table
        store.init_schema()


def test_runs_spread_over_shards_one_run_per_shard_same_findings(cluster, clickhouse_db_url):
    with open_store(cluster.url(1)) as store:
        init_cluster(store, "ranksight")
        run_ids = []
        for i, fault in enumerate(
            ["slow:rank=3,factor=2,from_step=5", "none", "slow:rank=1,factor=3,from_step=4", "none"]
        ):
            cfg = SynthConfig(
                ranks=8, dp=2, tp=2, pp=2, steps=24, faults=(fault,), seed=i, run_id=f"syn-{i}"
            )
            write_synthetic(store, cfg)
            run_ids.append(cfg.run_id)
    p1, p2 = cluster.server(1).tcp_port, cluster.server(2).tcp_port
    on = {r: (_local_count(p1, "steps", r), _local_count(p2, "steps", r)) for r in run_ids}
    assert all((a == 0) != (b == 0) for a, b in on.values()), on  # each run on one shard
    assert {a > 0 for a, _ in on.values()} == {True, False}, on  # both shards hold runs
    with open_store(cluster.url(2)) as dist, open_store(clickhouse_db_url) as single:
        single.init_schema()
        for run_id in run_ids:
            assert _copy_run(dist, single, run_id) > 0
            assert _findings(dist, run_id) == _findings(single, run_id)
        assert any(_findings(dist, r) for r in run_ids)


@pytest.mark.training
def test_demo_against_distributed_tables_matches_a_single_server(
    cluster, clickhouse_db_url, tmp_path
):
    """The real demo (4 gloo ranks, an agent shipping to shard 1's Distributed tables)."""
    with open_store(cluster.url(1)) as store:
        init_cluster(store, "ranksight")
    out = _cli(
        "demo", "--store", cluster.url(1), "--dp", "2", "--tp", "1", "--pp", "2", "--steps", "10",
        "--inject", "slow:rank=2,factor=3,from_step=3", "--format", "json",
        env={"RANKSIGHT_HOME": str(tmp_path / "home")},
    )  # fmt: skip
    assert out.returncode in (0, 3), out.stderr[-3000:]
    import json

    run_id = json.loads(out.stdout)["run_id"]
    with open_store(cluster.url(2)) as dist, open_store(clickhouse_db_url) as single:
        single.init_schema()
        copied = _copy_run(dist, single, run_id)
        stored = pd.concat(
            [dist.query("SELECT count() AS n FROM collectives WHERE run_id = %(r)s", {"r": run_id})]
        )
        assert copied > 0 and int(stored["n"].iloc[0]) > 0
        got, want = _findings(dist, run_id), _findings(single, run_id)
    assert got == want
    assert got and got[0]["culprit_rank"] == 2, got
    ports = (cluster.server(1).tcp_port, cluster.server(2).tcp_port)
    held = [_local_count(p, "collectives", run_id) for p in ports]
    assert sorted(held)[0] == 0 and sorted(held)[1] == int(stored["n"].iloc[0]), held
