"""The disk buffer on a real full filesystem (a 2 MiB tmpfs): the oldest batches are
dropped and counted, no half-written batch blocks the next, no record is counted twice,
and once space returns the agent carries on by itself."""

from __future__ import annotations

import logging
import os
import re
import subprocess
from pathlib import Path

import pytest

from ranksight.agent import Agent, AgentConfig
from ranksight.store import open_store
from tests.unit.test_agent_buffer import steps_stored, write_spool


@pytest.fixture
def small_disk(tmp_path: Path):
    """A 2 MiB tmpfs mounted for the test (needs root, as in CI)."""
    folder = tmp_path / "small"
    folder.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(folder)],
        capture_output=True, text=True,
    )  # fmt: skip
    if done.returncode:
        pytest.fail(f"mounting a 2 MiB tmpfs needs root: {done.stderr.strip()}", pytrace=False)
    yield folder
    subprocess.run(["umount", "-l", str(folder)], check=False)


def fill(folder: Path) -> Path:
    """Take every free byte of ``folder``'s filesystem with one file."""
    path = folder / "filler"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT)
    try:
        while os.write(fd, b"\0" * 4096):
            pass
    except OSError:
        pass
    finally:
        os.close(fd)
    return path


def leftovers(folder: Path) -> list[str]:
    batches = folder / "batches"
    return [p.name for p in batches.iterdir() if p.name.startswith(".")]


def test_a_full_disk_drops_the_oldest_counts_once_and_recovers(
    tmp_path, small_disk, chdb_url, caplog
) -> None:
    spool = tmp_path / "spool"
    store = open_store(chdb_url)
    store.init_schema()
    config = AgentConfig(
        buffer_dir=str(small_disk), buffer_bytes=64 << 20, batch_rows=2000, fsync=False,
        stats_interval_s=0,
    )  # fmt: skip
    agent = Agent(str(spool), store, config=config)
    written = write_spool(spool, "full", steps=40_000)  # about 6 MB as batches: 3x the disk
    with caplog.at_level(logging.WARNING, logger="ranksight.agent"):
        agent.read_once()  # the store is not sent to: the disk fills up
    assert leftovers(small_disk) == [], "no half-written batch is left behind"
    assert agent.stats.accepted == written, "each record counted once"
    assert agent.stats.dropped > 0, "the disk was full: the oldest batches were dropped"
    rows, _ = agent.buffer.size
    assert rows + agent.stats.dropped == written
    assert not [r for r in caplog.records if r.exc_info], "no tracebacks"
    agent.drain()
    assert steps_stored(store) == (rows, rows)
    # others fill the disk: nothing can be buffered; the records wait in the spool
    filler = fill(small_disk)
    more = write_spool(spool, "full2", steps=5000)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="ranksight.agent"):
        for _ in range(20):
            agent.read_once()
    assert agent.stats.accepted == written, "nothing sealed, nothing counted"
    assert leftovers(small_disk) == []
    assert not [r for r in caplog.records if r.exc_info], "no tracebacks"
    assert 1 <= len([r for r in caplog.records if "disk" in r.getMessage()]) <= 2
    filler.unlink()  # space returns: the agent carries on by itself
    agent.drain()
    total = written + more
    assert agent.stats.accepted == total
    stored, unique = steps_stored(store)
    assert stored == unique, "no step stored twice"
    assert stored + agent.stats.dropped == total
    print(f"written {total}, stored {stored}, dropped {agent.stats.dropped}, accepted {total}")
    assert agent.stats.dropped == written - rows, "nothing dropped once space was back"
    assert not os.listdir(small_disk / "batches")


@pytest.mark.clickhouse
def test_the_agent_process_on_a_full_disk_stores_or_counts_every_record(
    tmp_path, small_disk
) -> None:
    """`ranksight agent` with its buffer on the 2 MiB tmpfs, the server paused (inserts
    hang) while 200,000 records arrive: the disk fills, the oldest batches are dropped,
    and once the server answers again every record is stored once or counted dropped."""
    from ranksight.store.server import start_local_server
    from tests.helpers.agent_harness import start_agent, wait_for
    from tests.store.test_agent_faults import _quiet, stop

    server = start_local_server(tmp_path / "clickhouse")  # private: it is paused
    spool, log = tmp_path / "spool", tmp_path / "agent.log"
    url = f"clickhouse://127.0.0.1:{server.tcp_port}/diskfull"
    store = open_store(url)
    store.init_schema()
    agent = start_agent(
        str(spool), url, str(log), "--buffer-dir", str(small_disk), "--buffer-mb", "64",
        "--batch-rows", "5000", "--stats-interval", "0.5",
    )  # fmt: skip
    try:
        wait_for(lambda: "agent started" in log.read_text(), 180, "the agent to start")
        server.pause()
        try:
            written = write_spool(spool, "full", steps=200_000, chunks=10, pause_s=0.3)
            wait_for(lambda: "disk full" in log.read_text(), 120, "the disk to fill")
            assert agent.poll() is None, "the agent stays up"
        finally:
            server.resume()
        wait_for(lambda: _quiet(store), 240, "the backlog to drain")
        stats = store.query("SELECT max(accepted) AS a FROM agent_stats").iloc[0]
        got = store.query("SELECT count() AS n, uniqExact(step) AS u FROM steps").iloc[0]
    finally:
        stop(agent)
        server.kill()
    text = log.read_text()
    drops = [line for line in text.splitlines() if "disk full" in line and "dropped" in line]
    dropped = sum(int(n) for line in drops for n in re.findall(r"'steps': (\d+)", line))
    print(
        f"written {written}, stored {int(got['n'])}, dropped {dropped}, accepted {int(stats['a'])}"
    )
    assert "Traceback" not in text and "FileExistsError" not in text, text[-3000:]
    assert int(got["n"]) == int(got["u"]), "no step stored twice"
    assert dropped > 0 and int(got["n"]) + dropped == written == int(stats["a"]), (
        int(got["n"]), dropped, written, int(stats["a"]),
    )  # fmt: skip
