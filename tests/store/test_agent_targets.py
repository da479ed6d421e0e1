"""One store under any spelling of its URL is one destination: the agent's offsets and
delivered batches follow the place, not the text, so a restart with another spelling
stores nothing twice (chdb folders and a real ClickHouse server)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from ranksight.agent import Agent, AgentConfig
from ranksight.store import open_store
from ranksight.store.url import canonical_target
from ranksight.trainer_hooks.spool import SpoolWriter, spool_path
from tests.multiprocess.test_agent_parse import step

RUN = "run-t"


def json_spool(spool: Path, n: int) -> None:
    path = spool / RUN / "a0" / "rank00001-1.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    head = {"t": "_header", "run_id": RUN, "attempt": 0, "rank": 1}
    lines = [json.dumps(r) for r in [head, *(step(i) for i in range(n))]]
    path.write_text("\n".join(lines) + "\n")


def ship(spool: Path, url: str) -> int:
    """Run an agent for ``spool`` to the store spelled ``url`` until it is caught up."""
    store = open_store(url)
    store.init_schema()
    agent = Agent(str(spool), store, config=AgentConfig(stats_interval_s=0, fsync=False))
    try:
        agent.drain()
    finally:
        agent.close()
    return steps_of(store)


def steps_of(store) -> int:
    frame = store.query(
        "SELECT count() AS n, uniqExact(rank, step) AS u FROM steps WHERE run_id = %(r)s",
        {"r": RUN},
    ).iloc[0]
    assert int(frame["n"]) == int(frame["u"]), f"{int(frame['n'])} rows, {int(frame['u'])} steps"
    return int(frame["n"])


def spellings_of_a_folder(folder: Path) -> list[str]:
    return [f"chdb://{folder}", str(folder), f"{folder}/", f"chdb:{folder}/"]


def spellings_of_a_server(url: str) -> list[str]:
    port_db = url.split("127.0.0.1", 1)[1]
    return [
        url,
        url.replace("127.0.0.1", "localhost"),
        f"{url}/",
        f"clickhouse://localhost{port_db}",
    ]


def test_spellings_of_one_store_are_one_target(tmp_path) -> None:
    folder = tmp_path / "store"
    assert len({canonical_target(u) for u in spellings_of_a_folder(folder)}) == 1
    server = "clickhouse://127.0.0.1:9000/db"
    same = [server, "clickhouse://localhost/db", "clickhouse://u:pw@[::1]:9000/db/"]
    assert len({canonical_target(u) for u in same}) == 1
    assert canonical_target("clickhouse://localhost:9001/db") != canonical_target(server)
    assert canonical_target("clickhouse://localhost/db2") != canonical_target(server)


@pytest.mark.parametrize(
    "backend", ["chdb", pytest.param("clickhouse", marks=pytest.mark.clickhouse)]
)
def test_a_restart_under_another_spelling_stores_nothing_twice(tmp_path, backend, request) -> None:
    spool = tmp_path / "spool"
    json_spool(spool, 100)
    if backend == "chdb":
        urls = spellings_of_a_folder(tmp_path / "store")
    else:
        urls = spellings_of_a_server(request.getfixturevalue("clickhouse_db_url"))
    for url in urls:
        assert ship(spool, url) == 100, url


def test_a_live_writer_s_segment_is_read_on_not_again_under_another_spelling(tmp_path) -> None:
    spool = tmp_path / "spool"
    header = {"run_id": RUN, "attempt": 0, "rank": 2}
    writer = SpoolWriter(spool_path(str(spool), RUN, 0, 2), header, max_buffered=10**6,
                         budget_bytes=1 << 30, flush_interval_s=3600)  # fmt: skip
    urls = spellings_of_a_folder(tmp_path / "store")
    try:
        for k, url in enumerate(urls):
            for i in range(250 * k, 250 * (k + 1)):
                writer.put(step(i))
            writer._drain()
            time.sleep(0.05)
            assert ship(spool, url) == 250 * (k + 1), url
    finally:
        writer.close()
    assert ship(spool, urls[0]) == 1000


def test_the_state_folder_of_an_earlier_version_is_carried_on(tmp_path) -> None:
    """Agents used to key their folder by the URL's text: after an upgrade that folder is
    renamed to the canonical one, so its offsets hold and nothing is stored twice."""
    from ranksight.agent.tailer import legacy_state_dir, state_dir_for

    spool, url = tmp_path / "spool", f"{tmp_path / 'store'}/"
    json_spool(spool, 100)
    assert ship(spool, url) == 100
    Path(state_dir_for(str(spool), url)).rename(legacy_state_dir(str(spool), url))
    assert ship(spool, url) == 100
    assert not Path(legacy_state_dir(str(spool), url)).exists()
