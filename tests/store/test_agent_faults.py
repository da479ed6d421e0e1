"""The agent's delivery guarantees under faults, with real processes: a hooked gloo job,
`ranksight agent` processes and a real ClickHouse 18.16 server that is killed, restarted
and paused. After each fault every record the ranks wrote is in the store exactly once,
checked against the ranks' own counters and spool lines (``tests/helpers/agent_harness.py``)."""

from __future__ import annotations

import glob
import os
import re
import signal
import subprocess
import time

import pandas as pd
import pytest

from ranksight.agent import Agent, AgentConfig
from ranksight.store import StoreError, open_store
from ranksight.store.clickhouse_store import ClickHouseStore
from ranksight.store.server import LocalServer, start_local_server
from tests.helpers.agent_harness import (
    assert_exactly_once,
    start_agent,
    start_job,
    stored_count,
    wait_for,
)

pytestmark = [pytest.mark.clickhouse, pytest.mark.training]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> LocalServer:
    """A private server for these tests only: they kill and pause it."""
    srv = start_local_server(tmp_path_factory.mktemp("faulty-clickhouse"))
    yield srv
    srv.kill()  # a crash-safe test server: no need to wait for a clean shutdown


def fresh_url(server: LocalServer, name: str) -> str:
    return f"clickhouse://127.0.0.1:{server.tcp_port}/{name}_{os.getpid()}"


def stop(proc: subprocess.Popen) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
    return proc.wait()


def finish(job: subprocess.Popen, out: str) -> None:
    assert job.wait(300) == 0, open(os.path.join(out, "job.log")).read()[-3000:]


def test_server_killed_for_30_s_mid_run_loses_and_duplicates_nothing(server, tmp_path) -> None:
    spool, out, url = str(tmp_path / "spool"), str(tmp_path), fresh_url(server, "kill")
    store = open_store(url)
    store.init_schema()
    agent = start_agent(spool, url, str(tmp_path / "agent.log"))
    job = start_job(spool, "srv-kill", steps=70, pace_s=0.5, out=out)
    try:
        wait_for(lambda: stored_count(store, "srv-kill") > 50, 180, "the first rows stored")
        server.kill()  # SIGKILL in the middle of the run
        time.sleep(30)
        server.restart()
        finish(job, out)
        n = assert_eventually_exactly_once(store, spool, "srv-kill", out)
    finally:
        stop(agent)
        stop(job)
    log = open(tmp_path / "agent.log").read()
    assert "store insert failed" in log, "the outage should have been seen by the agent"
    assert n > 1000


def assert_eventually_exactly_once(store, spool, run_id, out, ranks=2, timeout_s=120) -> int:
    """Wait until the agent caught up, then check exactly once, and that the agent deleted
    every spool segment of the run (each was closed and is stored)."""
    from tests.helpers.agent_harness import spool_files, spool_records

    want = sum(len(v) for v in spool_records(spool, run_id).values())
    wait_for(lambda: stored_count(store, run_id) >= want, timeout_s, f"{want} rows stored")
    time.sleep(1.0)  # a duplicate arriving late would show now
    n = assert_exactly_once(store, spool, run_id, out, ranks)
    segments = [p for p in spool_files(spool, run_id) if p.endswith(".spool")]
    assert len(segments) > 2 * ranks, "the ranks wrote several segments each"
    left = lambda: glob.glob(os.path.join(spool, run_id, "a*", "*.spool"))  # noqa: E731
    wait_for(lambda: not left(), 30, "the stored spool segments to be deleted")
    return n


def test_agent_killed_repeatedly_mid_run_loses_and_duplicates_nothing(server, tmp_path) -> None:
    spool, out, url = str(tmp_path / "spool"), str(tmp_path), fresh_url(server, "agentkill")
    store = open_store(url)
    store.init_schema()
    log = str(tmp_path / "agent.log")
    agent = start_agent(spool, url, log)
    job = start_job(spool, "agent-kill", steps=80, pace_s=0.4, out=out)
    try:
        wait_for(lambda: stored_count(store, "agent-kill") > 50, 180, "the first rows stored")
        for i, running_s in enumerate((0.7, 0.25, 1.3, 0.45)):  # different points of its cycle
            time.sleep(running_s)
            agent.kill()  # SIGKILL
            agent.wait()
            time.sleep(0.5)  # ranks keep writing meanwhile
            agent = start_agent(spool, url, log)
            started = lambda n=i + 2: open(log).read().count("agent started") >= n  # noqa: E731
            wait_for(started, 120, "the restarted agent to run")
        finish(job, out)
        assert_eventually_exactly_once(store, spool, "agent-kill", out)
    finally:
        stop(agent)
        stop(job)


def test_paused_server_does_not_hold_training_and_the_backlog_drains(server, tmp_path) -> None:
    spool, out, url = str(tmp_path / "spool"), str(tmp_path), fresh_url(server, "pause")
    store = open_store(url)
    store.init_schema()
    agent = start_agent(spool, url, str(tmp_path / "agent.log"))
    job = start_job(spool, "paused", steps=30, pace_s=0.2, out=out)
    try:
        wait_for(lambda: stored_count(store, "paused") > 20, 180, "the first rows stored")
        server.pause()  # SIGSTOP: connections hang, nothing is answered
        try:
            # The whole job finishes while the store answers nothing: training never
            # waited for it (and the ranks dropped nothing, checked below).
            finish(job, out)
        finally:
            server.resume()
        assert_eventually_exactly_once(store, spool, "paused", out)
    finally:
        stop(agent)
        stop(job)
    steps = store.query(
        "SELECT quantileExact(0.5)(end_ns - start_ns) AS median_ns, max(end_ns - start_ns) AS max_ns "
        "FROM steps WHERE run_id = 'paused'"
    )
    print("step time while the server was paused (ns):", steps.to_dict("records"))


def test_insert_that_times_out_on_a_stalled_server_is_retried_and_stored_once(
    server, tmp_path
) -> None:
    url = fresh_url(server, "late")
    open_store(url).init_schema()
    db = url.rsplit("/", 1)[1]
    store = ClickHouseStore("127.0.0.1", server.tcp_port, db, url=url, query_timeout=1.0)
    agent = Agent(str(tmp_path / "spool"), store, config=AgentConfig(stats_interval_s=0))
    agent.submit("steps", pd.DataFrame({"run_id": "warm-up", "step": [0]}))
    agent.read_once()
    assert agent.ship_once() == 1  # connected, schema checked
    frame = pd.DataFrame({"run_id": "late", "step": range(5000), "rank": 1})
    agent.submit("steps", frame)
    agent.read_once()
    server.pause()
    try:
        assert agent.ship_once() == 0  # the insert times out: for all it knows, it landed
        assert agent.stats.store_errors == 1
    finally:
        server.resume()
    deadline = time.monotonic() + 60
    while agent.ship_once() == 0:  # retried: waits for the stalled insert, then checks
        assert time.monotonic() < deadline, agent.stats.last_error
        time.sleep(0.2)
    got = open_store(url).query(
        "SELECT count() AS n, uniqExact(step) AS u FROM steps WHERE run_id = 'late'"
    )
    assert got.iloc[0].tolist() == [5000, 5000]
    assert agent.stats.shipped + agent.stats.already_stored == 5001  # with the warm-up row
    agent.close()


def test_full_buffer_drops_the_oldest_counts_and_reports_them_and_stays_up(
    server, tmp_path
) -> None:
    from tests.unit.test_agent_buffer import write_spool

    spool, url = tmp_path / "spool", fresh_url(server, "full")
    store = open_store(url)
    store.init_schema()
    log = tmp_path / "agent.log"
    agent = start_agent(
        str(spool), url, str(log), "--buffer-mb", "1", "--batch-rows", "20000",
        "--stats-interval", "0.5",
    )  # fmt: skip
    try:
        wait_for(lambda: "agent started" in log.read_text(), 180, "the agent to start")
        server.pause()  # inserts hang: everything piles up in the 1 MiB buffer
        try:
            written = write_spool(spool, "full", steps=60_000, chunks=6, pause_s=0.5)
            wait_for(lambda: "dropped" in log.read_text(), 120, "a drop to be reported")
            assert agent.poll() is None, "the agent must stay up"
        finally:
            server.resume()
        wait_for(lambda: _quiet(store), 180, "the backlog to drain")
        stats = store.query(
            "SELECT max(dropped) AS dropped, max(accepted) AS accepted FROM agent_stats"
        ).iloc[0]
        got = store.query(
            "SELECT count() AS n, uniqExact(step) AS u, max(step) AS last FROM steps"
        ).iloc[0]
    finally:
        stop(agent)
    text = log.read_text()
    drops = [line for line in text.splitlines() if "disk buffer over" in line]
    logged = sum(int(n) for line in drops for n in re.findall(r"'steps': (\d+)", line))
    assert int(got["n"]) == int(got["u"]), "no step may be stored twice"
    assert int(got["n"]) + logged == written == int(stats["accepted"]), "each record is counted"
    assert 0 < logged <= int(stats["dropped"]), "agent_stats reports the drops (its own rows too)"
    assert int(got["last"]) == written - 1, "drop_oldest keeps the newest records"
    assert "(drop_oldest)" in text


def _quiet(store) -> bool:
    """The agent has shipped everything it holds (its last stats row says so)."""
    try:
        row = store.query(
            "SELECT argMax(buffered_rows, ts_ns) AS b, argMax(accepted, ts_ns) AS a, "
            "argMax(shipped, ts_ns) AS s, argMax(dropped, ts_ns) AS d FROM agent_stats"
        ).iloc[0]
    except StoreError:
        return False
    return (
        int(row["a"]) > 0 and int(row["b"]) == 0 and int(row["s"]) >= int(row["a"]) - int(row["d"])
    )
