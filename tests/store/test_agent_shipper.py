"""Shipper processes (``agent/shipper.py``): the agent's inserts into a ClickHouse server
run in child processes; one that dies mid-batch is restarted and every record is stored
exactly once; they end with the agent, also when it is killed. Real processes, a real
ClickHouse 18.16 server (a private one: it is paused here)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pandas as pd
import psutil
import pytest

from ranksight.agent import Agent, AgentConfig
from ranksight.store import open_store
from ranksight.store.server import LocalServer, start_local_server

pytestmark = [pytest.mark.clickhouse]

T0 = 1_700_000_000_000_000_000


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> LocalServer:
    """A private server for these tests only: they pause it."""
    srv = start_local_server(tmp_path_factory.mktemp("shipper-clickhouse"))
    yield srv
    srv.kill()


def fresh_url(server: LocalServer, name: str) -> str:
    url = f"clickhouse://127.0.0.1:{server.tcp_port}/{name}_{os.getpid()}"
    open_store(url).init_schema()
    return url


def steps(run_id: str, first: int, n: int) -> pd.DataFrame:
    return pd.DataFrame({"run_id": run_id, "step": range(first, first + n), "start_ns": T0 + first})


def wait_for(what, timeout: float = 60.0, every: float = 0.05):
    deadline = time.monotonic() + timeout
    while not (got := what()):
        assert time.monotonic() < deadline, f"timed out waiting for {what.__doc__ or what}"
        time.sleep(every)
    return got


class Running:
    """``agent.run`` in a thread until :meth:`stop`."""

    def __init__(self, agent: Agent) -> None:
        self.agent, self.stop_event = agent, threading.Event()
        self.thread = threading.Thread(target=agent.run, args=(self.stop_event,))
        self.thread.start()

    def stop(self) -> None:
        self.stop_event.set()
        self.thread.join(60)
        assert not self.thread.is_alive()
        self.agent.close()


def stored(url: str, run_id: str) -> tuple[int, int]:
    row = open_store(url).query(
        "SELECT count() AS n, uniqExact(step) AS u FROM steps WHERE run_id = %(r)s",
        {"r": run_id},
    )
    return tuple(int(x) for x in row.iloc[0])


def shipper_children(proc: psutil.Process) -> list[psutil.Process]:
    return [c for c in proc.children() if "ranksight.agent.shipper" in " ".join(c.cmdline())]


def agent_for(tmp_path, url: str, **cfg) -> Agent:
    config = AgentConfig(stats_interval_s=0, interval_s=0.1, retry_max_s=0.5, **cfg)
    return Agent(str(tmp_path / "spool"), open_store(url), config=config)


def test_a_shipper_process_killed_with_its_insert_in_flight_is_restarted_and_stores_once(
    server, tmp_path
) -> None:
    url = fresh_url(server, "inflight")
    agent = agent_for(tmp_path, url, shippers=1)
    running = Running(agent)
    try:
        shipper = agent.shipper_processes[0]
        wait_for(lambda: shipper.ready)
        agent.submit("steps", steps("warm", 0, 1))
        wait_for(lambda: agent.stats.shipped == 1)
        first_pid = shipper.pid
        server.pause()  # the next insert stalls inside the server
        try:
            agent.submit("steps", steps("kill", 0, 20_000))
            seq = wait_for(lambda: [s for s in agent.buffer.seqs() if agent.buffer.attempted(s)])
            time.sleep(0.5)  # handed to the shipper process, which is sending it
            assert agent.stats.shipped == 1 and seq
            os.kill(first_pid, signal.SIGKILL)
            wait_for(lambda: agent.stats.store_errors >= 1)
        finally:
            server.resume()
        agent.submit("steps", steps("kill", 20_000, 5_000))  # more after the death
        wait_for(lambda: agent.stats.shipped + agent.stats.already_stored == 25_001)
        assert stored(url, "kill") == (25_000, 25_000), "every record once"
        assert shipper.started == 2 and shipper.pid not in (None, first_pid)
        assert "shipper process died" in agent.stats.last_error
        assert agent.buffer.seqs() == []
    finally:
        running.stop()
    assert agent.shipper_processes[0].pid is None, "ended with the agent"
    assert not psutil.pid_exists(first_pid) or psutil.Process(first_pid).status() == "zombie"


def test_shipper_processes_killed_repeatedly_while_batches_flow_store_every_record_once(
    server, tmp_path
) -> None:
    url = fresh_url(server, "flow")
    agent = agent_for(tmp_path, url, shippers=2, batch_rows=4_000)
    running = Running(agent)
    sent, kills = 0, 0
    try:
        wait_for(lambda: all(p.ready for p in agent.shipper_processes))
        for round_ in range(12):
            agent.submit("steps", steps("flow", sent, 6_000))
            sent += 6_000
            time.sleep(0.15)
            if round_ % 3 == 1:  # a shipper process dies wherever it is: reading,
                pids = [p.pid for p in agent.shipper_processes if p.pid]  # sending, answering
                if pids:
                    os.kill(pids[round_ % len(pids)], signal.SIGKILL)
                    kills += 1
        wait_for(lambda: agent.stats.shipped + agent.stats.already_stored == sent, timeout=120)
        assert stored(url, "flow") == (sent, sent), "every record once"
        assert kills >= 3
        assert sum(p.started for p in agent.shipper_processes) >= 2 + 1
        assert agent.stats.dropped == 0 and agent.buffer.seqs() == []
    finally:
        running.stop()


def test_an_idle_shipper_process_exits_and_one_starts_for_the_next_batch(server, tmp_path):
    url = fresh_url(server, "idle")
    agent = agent_for(tmp_path, url, shippers=1, shipper_idle_s=0.5)
    running = Running(agent)
    try:
        shipper = agent.shipper_processes[0]
        agent.submit("steps", steps("idle", 0, 100))
        wait_for(lambda: agent.stats.shipped == 100)
        wait_for(lambda: shipper.pid is None, timeout=10)  # idle: gone, memory given back
        agent.submit("steps", steps("idle", 100, 100))
        wait_for(lambda: agent.stats.shipped == 200)
        assert shipper.started == 2 and stored(url, "idle") == (200, 200)
    finally:
        running.stop()


def test_a_chdb_folder_is_shipped_from_threads(tmp_path, chdb_url) -> None:
    agent = Agent(
        str(tmp_path / "spool"), open_store(chdb_url), config=AgentConfig(stats_interval_s=0)
    )
    running = Running(agent)
    try:
        agent.submit("steps", steps("chdb", 0, 10))
        wait_for(lambda: agent.stats.shipped == 10)
        assert agent.shipper_processes == [] and not shipper_children(psutil.Process())
    finally:
        running.stop()


def test_shipper_processes_die_with_a_killed_agent(server, tmp_path) -> None:
    url = fresh_url(server, "orphan")
    cmd = [sys.executable, "-m", "ranksight.cli", "agent", "--spool", str(tmp_path / "spool")]
    cmd += ["--store", url, "--interval", "0.1", "--collectors", "none"]
    env = {k: v for k, v in os.environ.items() if k != "RANKSIGHT_STORE"}
    agent = subprocess.Popen(cmd, env=env, stderr=subprocess.DEVNULL)
    try:
        proc = psutil.Process(agent.pid)
        children = wait_for(
            lambda: len(shipper_children(proc)) == 2 and shipper_children(proc),
            timeout=60,
            every=0.2,
        )
        agent.kill()
        agent.wait(10)
        gone, alive = psutil.wait_procs(children, timeout=10)
        assert alive == [], "shipper processes outlived the agent"
    finally:
        if agent.poll() is None:
            agent.kill()


def test_uncompressed_traffic_is_a_setting_the_shipper_processes_follow(
    server, tmp_path, monkeypatch
) -> None:
    from ranksight.store.base import StoreError

    url = fresh_url(server, "plain")
    monkeypatch.setenv("RANKSIGHT_CH_COMPRESSION", "none")
    store = open_store(url)
    assert not store._client.connection.compression
    agent = Agent(str(tmp_path / "spool"), store, config=AgentConfig(stats_interval_s=0))
    assert agent._ship_spec["clickhouse"]["compression"] == "none"  # what the children open
    running = Running(agent)
    try:
        agent.submit("steps", steps("plain", 0, 1000))
        wait_for(lambda: agent.stats.shipped == 1000)
        assert stored(url, "plain") == (1000, 1000)
    finally:
        running.stop()
    monkeypatch.setenv("RANKSIGHT_CH_COMPRESSION", "gzip")
    with pytest.raises(StoreError, match="RANKSIGHT_CH_COMPRESSION is 'gzip': want lz4 or none"):
        open_store(url)
    monkeypatch.delenv("RANKSIGHT_CH_COMPRESSION")
    assert open_store(url)._client.connection.compression  # lz4 by default
