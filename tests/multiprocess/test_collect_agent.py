"""Collectors inside the agent: threads, the batching sink, failures that must not stop
the agent, and ``ranksight agent --collectors``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from ranksight.agent.collect import NAMES, CollectConfig, Collection, Sink, parse_collectors
from ranksight.collectors.base import Collector, Unavailable, frame
from ranksight.store import StoreError, open_store


class Ticker(Collector):
    name, tables, interval_s = "ticker", ("host_samples",), 0.05

    def __init__(self) -> None:
        self.n = 0

    def collect(self, now_ns: int):
        self.n += 1
        return {"host_samples": [{"host": "n1", "ts_ns": now_ns, "cpu_pct": float(self.n)}]}


class Broken(Collector):
    name, tables, interval_s = "broken", (), 0.02

    def collect(self, now_ns: int):
        raise OSError("sensor gone")


class Missing(Collector):
    name, tables, interval_s = "missing", (), 1.0

    def open(self) -> None:
        raise Unavailable("no such hardware here")

    def collect(self, now_ns: int):
        raise AssertionError("never asked")


class FlakyStore:
    """A store whose first ``fail`` inserts raise StoreError."""

    url = "flaky"

    def __init__(self, fail: int) -> None:
        self.fail, self.rows = fail, {}

    def insert(self, table: str, df) -> int:
        if self.fail:
            self.fail -= 1
            raise StoreError("flaky: server down")
        self.rows.setdefault(table, []).extend(df.to_dict("records"))
        return len(df)


def test_parse_collectors() -> None:
    assert parse_collectors("default") == NAMES and parse_collectors("none") == ()
    assert parse_collectors("host, nvml,host") == ("host", "nvml")
    with pytest.raises(ValueError, match=r"unknown collectors \['gpu'\]"):
        parse_collectors("host,gpu")
    with pytest.raises(ValueError, match="flush_s"):
        CollectConfig(flush_s=0)


def test_failing_and_missing_collectors_do_not_stop_the_others(tmp_path) -> None:
    store = FlakyStore(fail=0)
    config = CollectConfig(collectors=(), flush_s=0.1, host="n1")
    ticker = Ticker()
    collection = Collection(store, config, [ticker, Broken(), Missing()])
    collection.start()
    time.sleep(0.6)
    collection.stop()
    assert collection.state == {"ticker": "stopped", "broken": "stopped", "missing": "unavailable"}
    assert collection.errors["broken"] >= 10 and "ticker" not in collection.errors
    assert len(store.rows["host_samples"]) == ticker.n >= 5
    status = [(r["collector"], r["state"], r["message"]) for r in store.rows["collector_status"]]
    assert status.count(("missing", "unavailable", "no such hardware here")) == 1
    assert [s for s in status if s[:2] == ("broken", "error")] == [
        ("broken", "error", "OSError: sensor gone")
    ], "said once"


def test_sink_keeps_rows_while_the_store_is_down_and_bounds_them() -> None:
    store = FlakyStore(fail=2)
    sink = Sink(store, max_rows=5)
    sink.add({"host_samples": [{"host": "n1", "ts_ns": i} for i in range(3)]})
    assert sink.flush() == 0 and sink.store_errors == 1
    sink.add({"host_samples": [{"host": "n1", "ts_ns": i} for i in range(3, 7)]})
    assert sink.dropped == 2, "over the bound: the oldest go"
    assert sink.flush() == 0
    assert sink.flush() == 5
    assert [r["ts_ns"] for r in store.rows["host_samples"]] == [2, 3, 4, 5, 6]
    sink.add({"host_samples": [{"host": "n1", "bogus": 1}]})
    assert sink.flush() == 0 and sink.dropped == 3, (
        "a row the schema rejects is dropped, not retried"
    )


def test_frame_types_rows_by_the_schema() -> None:
    df = frame(
        "gpu_samples",
        [{"host": "n", "ts_ns": 5, "gpu_index": 1, "power_w": None, "clock_events": -1}],
    )
    assert df.power_w.isna().all() and df.clock_events[0] == -1 and df.unsupported[0] == ""
    assert str(df.gpu_index.dtype) == "uint32"
    with pytest.raises(ValueError, match="gpu_samples.gpu_index"):
        frame("gpu_samples", [{"gpu_index": -1}])
    with pytest.raises(ValueError, match="no columns"):
        frame("gpu_samples", [{"watts": 1}])


def test_agent_command_runs_collectors(tmp_path) -> None:
    store = f"chdb://{tmp_path / 'store'}"
    env = {**os.environ, "RANKSIGHT_HOME": str(tmp_path)}
    from typer.testing import CliRunner

    from ranksight.cli import app

    args = ["agent", "--spool", str(tmp_path / "spool"), "--store", store, "--collectors", "gpu"]
    bad = CliRunner().invoke(app, args, env=env)
    assert bad.exit_code == 2 and "unknown collectors ['gpu']" in bad.output
    agent = subprocess.Popen(
        [sys.executable, "-m", "ranksight.cli", "agent", "--spool", str(tmp_path / "spool"), "--store", store,
         "--collectors", "host,netdev,rdma,nvml"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        s = open_store(store)
        deadline = time.monotonic() + 60
        n = 0
        while time.monotonic() < deadline and n < 3:
            time.sleep(1)
            try:
                n = int(s.query("SELECT count() AS n FROM host_samples")["n"][0])
            except StoreError:
                n = 0
    finally:
        agent.send_signal(signal.SIGTERM)
        _, err = agent.communicate(timeout=60)
    assert agent.returncode == 0, err[-2000:]
    assert n >= 3, err[-2000:]
    states = s.query(
        "SELECT collector, state FROM collector_status WHERE state != 'running' ORDER BY collector, state"
    )
    got = {(r["collector"], r["state"]) for r in states.to_dict("records")}
    assert ("nvml", "unavailable") in got and ("host", "stopped") in got
    assert "collector nvml unavailable: NVML is not available on this node" in err
