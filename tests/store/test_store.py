"""The store on both backends: chdb folder and a real ClickHouse 18.16 server."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ranksight.store import Store, StoreError, open_store, schema
from ranksight.store.chdb_store import ChdbStore
from ranksight.store.ddl import create_database_sql, create_table_sql
from ranksight.store.frames import conform
from ranksight.store.server import free_port
from ranksight.store.sql import bind, rewrite_tables

T0 = 1_700_000_000_000_000_000  # ns; 2023-11-14


def sample(table: schema.Table, rows: int = 5) -> pd.DataFrame:
    """Rows for ``table`` with a distinct, type-appropriate value in every column."""
    data = {}
    for name, ch_type in table.columns:
        i = np.arange(rows)
        if ch_type == "String":
            data[name] = [f"{name}-{k}" for k in i]
        elif ch_type == "Float64":
            data[name] = i * 0.5
        elif ch_type == "Int64":
            data[name] = T0 + i * 1_000_000
        elif ch_type.startswith("Int"):
            data[name] = i - 1
        else:
            data[name] = i
    return pd.DataFrame(data)


def read_back(store: Store, table: schema.Table) -> pd.DataFrame:
    """All of ``table``, sorted by its ORDER BY key."""
    return store.query(f"SELECT * FROM {table.name} ORDER BY {', '.join(table.order_by)}")


# --- schema, insert, read back ------------------------------------------------------


def test_init_schema_is_idempotent(store: Store) -> None:
    store.init_schema()  # the fixture ran it once already
    versions = store.query("SELECT version, count() AS n FROM schema_version GROUP BY version")
    assert versions.to_dict("records") == [{"version": schema.SCHEMA_VERSION, "n": 1}]
    assert store.schema_version() == schema.SCHEMA_VERSION
    for name in schema.RECORD_TABLES + ("runs", "findings"):
        assert store.query(f"SELECT count() AS n FROM {name}")["n"].tolist() == [0]


@pytest.mark.parametrize("name", [n for n in schema.TABLES if n != "schema_version"])
def test_every_table_reads_back_what_was_inserted(store: Store, name: str) -> None:
    table = schema.table(name)
    frame = sample(table)
    assert store.insert(name, frame) == len(frame)
    expected = conform(table, frame).to_pandas()
    pd.testing.assert_frame_equal(read_back(store, table), expected)


def test_insert_fills_missing_columns_and_rejects_bad_ones(store: Store) -> None:
    store.insert("steps", pd.DataFrame({"run_id": ["r"], "rank": [3], "loss": [np.nan]}))
    row = read_back(store, schema.STEPS).iloc[0]
    assert (row["run_id"], row["attempt"], row["rank"], row["tokens"]) == ("r", 0, 3, 0)
    assert np.isnan(row["loss"]), "NaN loss must stay NaN, not become 0 or null"
    with pytest.raises(ValueError, match="no columns.*bogus"):
        store.insert("steps", pd.DataFrame({"bogus": [1]}))
    with pytest.raises(ValueError, match="steps.rank"):
        store.insert("steps", pd.DataFrame({"rank": [-1]}))  # UInt32
    with pytest.raises(ValueError, match="unknown table"):
        store.insert("nope", pd.DataFrame({"a": [1]}))
    assert store.insert("steps", pd.DataFrame(columns=["run_id"])) == 0


def test_query_errors_are_store_errors_and_do_not_poison_the_next_query(store: Store) -> None:
    with pytest.raises(StoreError, match="nope"):
        store.query("SELECT nope FROM steps")
    with pytest.raises(StoreError):
        store.query("SELECT throwIf(1) AS x")  # fails while running, not parsing
    assert store.query("SELECT 1 AS x")["x"].tolist() == [1]
    with pytest.raises(StoreError, match="has no value"):
        store.query("SELECT %(missing)s AS x", {})


# --- parameters ---------------------------------------------------------------------

HOSTILE = "it's \\' a \"trap\"); DROP TABLE steps; -- %s %(x)s \\\\ \n\t\0 ünï"


def test_hostile_string_parameters_are_bound_as_values(store: Store) -> None:
    store.insert("steps", pd.DataFrame({"run_id": [HOSTILE, "plain"], "step": [7, 8]}))
    got = store.query("SELECT run_id, step FROM steps WHERE run_id = %(run)s", {"run": HOSTILE})
    assert got.to_dict("records") == [{"run_id": HOSTILE, "step": 7}]
    echo = store.query(
        "SELECT %(s)s AS s, %(n)s AS n, %(f)s AS f", {"s": HOSTILE, "n": 5, "f": 0.25}
    )
    assert echo.iloc[0].tolist() == [HOSTILE, 5, 0.25]
    hits = store.query(
        "SELECT count() AS n FROM steps WHERE run_id IN %(runs)s AND step IN %(steps)s",
        {"runs": (HOSTILE, "x'y"), "steps": (np.int64(7), 8)},  # IN takes tuples on 18.16
    )
    assert hits["n"].tolist() == [1]
    arrays = store.query("SELECT has(%(a)s, step) AS h FROM steps ORDER BY step", {"a": [8, 9]})
    assert arrays["h"].tolist() == [0, 1]
    assert store.query("SELECT count() AS n FROM steps")["n"].tolist() == [2]


def test_bind_follows_clickhouse_driver_escaping() -> None:
    assert bind("SELECT %(s)s", {"s": "a'b\\c"}) == "SELECT 'a\\'b\\\\c'"
    assert bind("SELECT %(b)s, %(t)s", {"b": True, "t": (1, "x")}) == "SELECT 1, (1, 'x')"
    assert bind("SELECT '100%'", None) == "SELECT '100%'"


def test_rewrite_tables_touches_only_table_positions() -> None:
    tables = {"steps": "F(steps)", "ranks": "F(ranks)"}
    sql = (
        "SELECT steps.rank, 'FROM steps' AS s FROM steps JOIN ranks AS r USING (rank) "
        "JOIN (SELECT rank FROM ranks) q ON 1 = 1 -- FROM steps\n"
        "WHERE x IN (SELECT a FROM db.steps)"
    )
    assert rewrite_tables(sql, tables) == (
        "SELECT steps.rank, 'FROM steps' AS s FROM F(steps) AS steps "
        "JOIN F(ranks) AS r USING (rank) "
        "JOIN (SELECT rank FROM F(ranks) AS ranks) q ON 1 = 1 -- FROM steps\n"
        "WHERE x IN (SELECT a FROM db.steps)"
    )


# --- the same answers on both backends ----------------------------------------------


def training_run(seed: int = 0) -> dict[str, pd.DataFrame]:
    """A small 8-rank run (2 pipeline stages) where rank 5 computes slowly."""
    rng = np.random.default_rng(seed)
    world, steps = 8, 12
    ranks = pd.DataFrame(
        {
            "run_id": "run-a",
            "rank": np.arange(world),
            "host": [f"node{r // 4}" for r in range(world)],
            "pp": np.arange(world) // 4,
            "dp": np.arange(world) % 4,
        }
    )
    rank, step = np.meshgrid(np.arange(world), np.arange(steps), indexing="ij")
    rank, step = rank.ravel(), step.ravel()
    start = T0 + step * 1_000_000_000 + rng.integers(0, 1000, rank.size)
    duration = 800_000_000 + rng.integers(0, 50_000_000, rank.size) + (rank == 5) * 300_000_000
    steps_frame = pd.DataFrame(
        {
            "run_id": "run-a",
            "rank": rank,
            "step": step,
            "start_ns": start,
            "end_ns": start + duration,
            "loss": np.where(rank >= 4, 2.0 / (1 + step), np.nan),
        }
    )
    collectives = pd.DataFrame(
        {
            "run_id": "run-a",
            "rank": rank,
            "step": step,
            "group_id": [f"dp{r // 4}" for r in rank],
            "group_seq": step,
            "op": "all_reduce",
            "bytes": 1 << 20,
            "enqueue_ns": start + duration - 100_000 * (rank == 5),
            "start_ns": start + duration,
            "end_ns": start + duration + 5_000_000,
        }
    )
    return {"ranks": ranks, "steps": steps_frame, "collectives": collectives}


ANALYTIC_QUERIES = [
    # per-rank step time against peers of the same pipeline stage (JOIN, GROUP BY, quantile)
    """SELECT s.rank AS rank, r.pp AS pp, r.host AS host, count() AS steps,
              quantile(0.5)(s.end_ns - s.start_ns) AS median_ns,
              max(s.end_ns - s.start_ns) AS max_ns
       FROM steps AS s ALL INNER JOIN ranks AS r ON s.run_id = r.run_id AND s.rank = r.rank
       WHERE s.run_id = %(run)s GROUP BY rank, pp, host ORDER BY rank""",
    # the slowest rank of each step (argMax) and the last arriver of each collective
    """SELECT step, argMax(rank, end_ns - start_ns) AS slowest, max(end_ns - start_ns) AS ns
       FROM steps WHERE run_id = %(run)s GROUP BY step ORDER BY step""",
    """SELECT group_id, group_seq, count() AS ranks, argMax(rank, enqueue_ns) AS last,
              max(enqueue_ns) - min(enqueue_ns) AS skew_ns
       FROM collectives GROUP BY group_id, group_seq ORDER BY group_id, group_seq""",
    # a joined sub-query (aliased: 26 requires it), USING, and a tuple parameter
    """SELECT host, count() AS n, avg(slow) AS slow_share, sum(loss_steps) AS loss_steps
       FROM (SELECT run_id, rank, (end_ns - start_ns) > %(limit)s AS slow,
                    loss = loss AS loss_steps
             FROM steps WHERE rank IN %(ranks)s) AS s
       ALL INNER JOIN ranks USING (run_id, rank) GROUP BY host ORDER BY host""",
    """SELECT pp, quantiles(0.1, 0.5, 0.9)(end_ns - start_ns) AS q, uniqExact(rank) AS ranks,
              countIf(loss = loss) AS with_loss, arraySort(groupUniqArray(rank)) AS all_ranks
       FROM steps ALL INNER JOIN ranks USING (run_id, rank) GROUP BY pp ORDER BY pp""",
    "SELECT * FROM steps WHERE rank = 99",  # empty result keeps column types
]


@pytest.mark.clickhouse
def test_same_sql_gives_identical_frames_on_both_backends(
    chdb_url: str, clickhouse_db_url: str
) -> None:
    run = training_run()
    params = {"run": "run-a", "limit": 1_000_000_000, "ranks": (0, 1, 5, 6)}
    results = []
    for url in (chdb_url, clickhouse_db_url):
        with open_store(url) as store:
            store.init_schema()
            for table, frame in run.items():
                store.insert(table, frame)
            results.append([store.query(sql, params) for sql in ANALYTIC_QUERIES])
    for sql, on_chdb, on_server in zip(ANALYTIC_QUERIES, *results, strict=True):
        pd.testing.assert_frame_equal(on_chdb, on_server, obj=" ".join(sql.split())[:60])
    by_step = results[0][1]
    assert (by_step["slowest"] == 5).all(), "the injected slow rank is the slowest every step"
    assert results[0][0]["steps"].tolist() == [12] * 8


def test_ddl_is_accepted_by_chdb_engine(tmp_path: Path) -> None:
    """The server DDL (already run on 18.16 by the clickhouse fixtures) also works on chdb
    26; run in a child because a chdb Session holds the process's engine."""
    statements = [create_database_sql("rs")] + [
        create_table_sql(t, "rs") for t in schema.TABLES.values()
    ]
    script = textwrap.dedent(
        f"""
        import sys
        from chdb import session
        s = session.Session({str(tmp_path / "sess")!r})
        for sql in {statements!r} * 2:
            s.query(sql)
        s.query("INSERT INTO rs.steps (run_id, start_ns) VALUES ('r', {T0})")
        print(s.query("SELECT toYYYYMM(time) FROM rs.steps", "CSV").bytes().decode().strip())
        s.close()
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "202311"


# --- chdb: readers while a writer writes; compaction --------------------------------

WRITER = """
import sys, time, numpy as np, pandas as pd
from ranksight.store import open_store
store = open_store(sys.argv[1])
for batch in range(int(sys.argv[2])):
    store.insert("steps", pd.DataFrame({"run_id": "w", "step": batch, "rank": np.arange(100)}))
    time.sleep(0.01)
"""

READER = """
import sys, time
from ranksight.store import open_store
store = open_store(sys.argv[1])
seen = []
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    n = int(store.query("SELECT count() AS n FROM steps WHERE run_id = 'w'")["n"].iloc[0])
    seen.append(n)
    if n == int(sys.argv[2]) * 100:
        break
print(" ".join(map(str, seen)))
"""


def test_readers_see_whole_batches_while_a_writer_inserts_and_compaction_runs(
    chdb_url: str,
) -> None:
    batches = 60
    with open_store(chdb_url) as store:
        store.init_schema()
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", code, chdb_url, str(batches)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for code in (READER, WRITER)
        ]
        compactions = 0
        while procs[1].poll() is None:
            compactions += store.compact("steps") > 0
            time.sleep(0.05)
        out, err = procs[0].communicate(timeout=90)
        assert procs[1].returncode == 0, procs[1].stderr.read()
        assert procs[0].returncode == 0, err
        seen = [int(n) for n in out.split()]
        assert seen[-1] == batches * 100
        assert all(n % 100 == 0 for n in seen), "a reader saw part of a segment"
        assert seen == sorted(seen), "rows vanished or were counted twice during compaction"
        assert len(set(seen)) > 2, "the reader should have seen the run grow"
        assert compactions > 0
        assert store.query("SELECT count() AS n FROM steps")["n"].tolist() == [batches * 100]


def test_compact_merges_segments_without_changing_answers(chdb_url: str) -> None:
    with open_store(chdb_url) as store:
        store.init_schema()
        for step in range(20):
            store.insert("steps", pd.DataFrame({"run_id": "c", "step": step, "rank": [2, 1, 0]}))
        before = read_back(store, schema.STEPS)
        assert store.compact("steps") == 21  # 20 inserts + the empty init segment
        assert len(list((Path(store.folder) / "steps").glob("*.parquet"))) == 1
        pd.testing.assert_frame_equal(read_back(store, schema.STEPS), before)
        assert store.compact("steps") == 0


def test_tables_version_moves_with_inserts_and_compaction_only(chdb_url: str) -> None:
    """A chdb folder's tables version: the same while nothing is written, new after an
    insert (only for that table) and after a compaction that merges its segments."""
    with open_store(chdb_url) as store:
        store.init_schema()
        v0 = store.tables_version(["steps", "runs"])
        assert store.tables_version(["steps", "runs"]) == v0
        store.query("SELECT count() AS n FROM steps")  # a read changes nothing
        assert store.tables_version(["steps", "runs"]) == v0
        store.insert("steps", pd.DataFrame({"run_id": "v", "step": [0], "rank": [0]}))
        v1 = store.tables_version(["steps", "runs"])
        assert v1 != v0 and v1[1] == v0[1]  # runs untouched
        store.insert("steps", pd.DataFrame({"run_id": "v", "step": [1], "rank": [0]}))
        v2 = store.tables_version(["steps"])
        assert store.compact("steps") == 3
        assert store.tables_version(["steps"]) not in (v2, (v1[0],))
        assert store.tables_version(["no_such_table"]) == (("no_such_table", 0, hash(())),)


def test_inserts_compact_small_segments_automatically(tmp_path: Path) -> None:
    store = ChdbStore(tmp_path, auto_compact=5)
    store.init_schema()
    for step in range(23):
        store.insert("steps", pd.DataFrame({"run_id": "a", "step": [step]}))
        assert len(list((tmp_path / "steps").glob("*.parquet"))) <= 6
    got = store.query("SELECT count() AS n, uniqExact(step) AS u FROM steps")
    assert got.iloc[0].tolist() == [23, 23]


def test_interrupted_compaction_is_finished_by_the_next_reader(chdb_url: str) -> None:
    with open_store(chdb_url) as store:
        store.init_schema()
        for step in range(3):
            store.insert("steps", pd.DataFrame({"run_id": "i", "step": [step]}))
        folder = Path(store.folder) / "steps"
        olds = sorted(folder.glob("*.parquet"))
        # the state a compaction leaves if it dies after renaming the merged segment in
        merged = pa.concat_tables(pq.read_table(p) for p in olds)
        pq.write_table(merged, folder / "9-9-9.parquet")
        plan = {"merged": "9-9-9.parquet", "replaced": [p.name for p in olds]}
        (folder / "compact.intent").write_text(json.dumps(plan))
        assert store.query("SELECT count() AS n FROM steps")["n"].tolist() == [3]
        assert not (folder / "compact.intent").exists()
        assert [p.name for p in folder.glob("*.parquet")] == ["9-9-9.parquet"]


# --- URLs and failures --------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("ftp://host/db", "unknown store scheme 'ftp'"),
        ("clickhouse://host:99999/db", "bad port"),
        ("clickhouse://host:port/db", "bad port"),
        ("clickhouse://host:9000", "no database"),
        ("clickhouse://host/bad-name", "not a plain name"),
        ("clickhouse:///db", "no host"),
        ("chdb://", "no folder"),
    ],
)
def test_garbage_urls_raise_one_line_store_errors(url: str, says: str) -> None:
    with pytest.raises(StoreError, match=says) as caught:
        open_store(url, connect=False)
    message = str(caught.value)
    assert "\n" not in message and message.startswith(url.split("?")[0][:10])


def test_password_never_appears_in_errors() -> None:
    with pytest.raises(StoreError) as caught:
        open_store("clickhouse://bob:s3cret@127.0.0.1:99999/db")
    assert "s3cret" not in str(caught.value) and "bob:***@" in str(caught.value)


def test_unreachable_server_fails_fast_with_a_clear_message() -> None:
    port = free_port()  # nothing listens there
    started = time.monotonic()
    with pytest.raises(StoreError, match=f"cannot reach ClickHouse at 127.0.0.1:{port}"):
        open_store(f"clickhouse://u:pw@127.0.0.1:{port}/db")
    assert time.monotonic() - started < 5
    store = open_store(f"clickhouse://127.0.0.1:{port}/db", connect=False)
    with pytest.raises(StoreError, match="cannot reach ClickHouse"):
        store.insert("steps", pd.DataFrame({"run_id": ["r"]}))


def test_default_url_is_ranksight_store_else_a_folder_under_ranksight_home(
    tmp_path, monkeypatch
) -> None:
    monkeypatch.delenv("RANKSIGHT_STORE", raising=False)
    monkeypatch.setenv("RANKSIGHT_HOME", str(tmp_path))
    for url in (None, ""):
        store = open_store(url)
        assert isinstance(store, ChdbStore) and store.folder == tmp_path / "store"
    assert open_store(f"chdb://{tmp_path}/x").folder == tmp_path / "x"
    assert open_store(str(tmp_path / "y")).folder == tmp_path / "y"
    monkeypatch.setenv("RANKSIGHT_STORE", f"file://{tmp_path}/z")
    assert open_store(None).folder == tmp_path / "z"


def test_newer_schema_version_is_refused(store: Store) -> None:
    newer = schema.SCHEMA_VERSION + 1
    store.insert("schema_version", pd.DataFrame({"version": [newer], "applied_ns": [T0]}))
    with pytest.raises(StoreError, match=f"schema version {newer}, newer than"):
        store.init_schema()


def test_query_on_a_missing_chdb_store_says_to_initialize(tmp_path) -> None:
    with pytest.raises(StoreError, match="init_schema"):
        open_store(str(tmp_path / "none")).query("SELECT count() FROM steps")


def test_server_inserts_go_in_sort_key_order_with_every_row_kept() -> None:
    """Rows are sent in the table's ORDER BY order (String keys compare bytewise, like the
    server; constant keys are skipped), every column permuted alike, nothing lost."""
    import numpy as np
    import pandas as pd

    from ranksight.store.clickhouse_store import _SORT_MIN_ROWS, in_sort_key_order

    rng = np.random.default_rng(3)
    n = _SORT_MIN_ROWS + 500
    words = pd.Index([b"g10", b"g9", b"g1", b"g1-x"], dtype=object)  # not in byte order
    group = pd.Categorical.from_codes(rng.integers(0, 4, n), words)
    run = pd.Categorical.from_codes(np.zeros(n, dtype=np.int8), pd.Index([b"r"], dtype=object))
    seq = rng.integers(0, 50, n).astype(np.uint64)
    rank = rng.integers(0, 8, n).astype(np.uint32)
    value = np.arange(n, dtype=np.int64)  # identifies each row
    names = ["run_id", "group_id", "group_seq", "rank", "value"]
    got = in_sort_key_order(
        names, [run, group, seq, rank, value], ("run_id", "group_id", "group_seq", "rank")
    )
    keys = list(zip(np.asarray(got[1]), got[2], got[3], strict=True))
    assert keys == sorted(keys)
    assert sorted(got[4]) == list(value)  # a permutation of the rows
    original = {
        int(v): (g, s, r) for v, g, s, r in zip(value, np.asarray(group), seq, rank, strict=True)
    }
    assert all(original[int(v)] == k for v, k in zip(got[4], keys, strict=True))
    few = [c[:10] for c in (run, group, seq, rank, value)]
    assert all(
        a is b for a, b in zip(in_sort_key_order(names, few, ("group_id",)), few, strict=True)
    )
