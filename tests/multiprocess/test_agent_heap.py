"""The agent's heap (``agent/heap.py``): while busy its processes reuse the memory of one
batch for the next instead of faulting it in afresh; once idle they give it back. Real
processes (the C library's state is per process), real page-fault and RSS counters."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import pandas as pd
import pytest

from ranksight.agent import Agent, AgentConfig, heap
from ranksight.store import open_store

pytestmark = pytest.mark.skipif(
    heap._glibc() is None, reason="agent/heap.py acts on glibc only (this C library is not)"
)

# A shipper's insert in small: clickhouse-driver's growing BytesIO of the block, numpy
# columns, freed when the insert is done. Prints page faults per round, RSS after the last
# round's memory is freed, and RSS after heap.release().
CHILD = """
import io, json, resource, sys
import numpy as np
import psutil
from ranksight.agent import heap
kept = heap.keep() if sys.argv[1] == "keep" else None
chunk = b"x" * (1 << 20)
def one_insert():
    block = io.BytesIO()
    for _ in range(40):
        block.write(chunk)
    columns = [np.ones(1 << 20) for _ in range(12)]  # 12 x 8 MiB
    return len(block.getvalue()) + sum(c.size for c in columns)
one_insert()
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    one_insert()
faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / 5
rss_idle = psutil.Process().memory_info().rss
released = heap.release()
rss_released = psutil.Process().memory_info().rss
print(json.dumps({"kept": kept, "faults": faults, "rss_idle": rss_idle,
                  "released": released, "rss_released": rss_released}))
"""


def child(mode: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, mode], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_kept_heap_serves_the_next_batch_without_page_faults_and_release_gives_it_back():
    plain, kept = child("plain"), child("keep")
    assert kept["kept"] is True
    # 136 MiB touched a round: glibc's default maps most of it afresh (thousands of faults)
    assert plain["faults"] > 1000, plain
    assert kept["faults"] * 20 < plain["faults"], (kept, plain)
    # what the rounds freed is still resident while kept, and goes back with release()
    assert kept["rss_idle"] - kept["rss_released"] > 100 << 20, kept
    assert kept["released"] is True


def test_pad_out_of_range_is_refused():
    with pytest.raises(ValueError, match="heap pad"):
        heap.keep(-1)
    with pytest.raises(ValueError, match="heap pad"):
        heap.keep(2 << 30)


def test_the_agent_gives_its_heap_back_once_it_has_caught_up(tmp_path, chdb_url, monkeypatch):
    calls: list[tuple[str, int]] = []
    agent = Agent(
        str(tmp_path / "spool"),
        open_store(chdb_url),
        config=AgentConfig(stats_interval_s=0, interval_s=0.1),
    )
    monkeypatch.setattr(heap, "keep", lambda *a: calls.append(("keep", 0)) or True)
    monkeypatch.setattr(
        heap, "release", lambda: calls.append(("release", agent.stats.buffered_rows)) or True
    )
    stop = threading.Event()
    runner = threading.Thread(target=agent.run, args=(stop,))
    runner.start()
    try:
        time.sleep(0.5)
        assert [c[0] for c in calls] == ["keep"], "nothing read yet: nothing to give back"
        steps = pd.DataFrame({"run_id": "heap", "step": range(1000), "start_ns": 1})
        agent.submit("steps", steps)
        deadline = time.monotonic() + 30
        while not any(c[0] == "release" for c in calls):
            assert time.monotonic() < deadline, f"no release after the batch was stored: {calls}"
            time.sleep(0.05)
        assert next(c for c in calls if c[0] == "release") == ("release", 0), "buffer empty"
        while agent.stats.shipped < 1000:  # counted just after the batch leaves the buffer
            assert time.monotonic() < deadline, agent.stats
            time.sleep(0.01)
        time.sleep(0.5)
        assert [c[0] for c in calls].count("release") == 1, "once per busy spell, not each poll"
    finally:
        stop.set()
        runner.join()
        agent.close()
