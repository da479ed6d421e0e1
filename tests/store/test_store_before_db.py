"""A server store made before its database exists (the UI opened on a fresh server, an
agent started before ``db init``) works once the database is there: a failed connection
is never kept half set up; until then every call says which database is missing."""

from __future__ import annotations

import pandas as pd
import pytest

from ranksight.store import StoreError, open_store

pytestmark = pytest.mark.clickhouse


def test_a_store_made_before_its_database_works_once_it_exists(clickhouse_db_url) -> None:
    early = open_store(clickhouse_db_url, connect=False)
    database = clickhouse_db_url.rsplit("/", 1)[1]
    for _ in range(2):  # the second call finds what the first left behind
        with pytest.raises(StoreError, match=database):
            early.query("SELECT count() AS n FROM steps")
    with pytest.raises(StoreError, match=database):
        early.partitions("steps", pd.DataFrame({"start_ns": [1]}))
    row = pd.DataFrame({"run_id": ["r"], "step": [1], "start_ns": [1], "end_ns": [2]})
    with pytest.raises(StoreError, match=database):
        early.insert("steps", row)
    with open_store(clickhouse_db_url) as other:
        other.init_schema()  # another process creates it meanwhile
    assert early.query("SELECT count() AS n FROM steps")["n"].tolist() == [0]
    assert early.insert("steps", row) == 1
    assert early.partitions("steps", pd.DataFrame({"start_ns": [1]})) is not None
    early.close()
