"""The agent's disk buffer and offsets: batches survive restarts whole, the bound holds by
the drop policy, and a crash between sealing a batch and committing the offsets neither
loses nor repeats records."""

from __future__ import annotations

import json
import os
import random
import time
from pathlib import Path

import pytest

from ranksight.agent import Agent, AgentConfig
from ranksight.agent.buffer import DiskBuffer
from ranksight.agent.tailer import OFFSETS
from ranksight.store import open_store


def write_spool(spool: Path, run_id: str, steps: int, chunks: int = 1, pause_s: float = 0.0):
    """A rank's spool file with ``steps`` step records (random times: they compress like
    real ones), appended in ``chunks`` with pauses; returns the record count."""
    path = spool / run_id / "a0" / "rank00000-1.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = random.Random(7)
    with open(path, "a") as f:
        f.write(json.dumps({"t": "_header", "run_id": run_id, "attempt": 0, "rank": 0}) + "\n")
        per = steps // chunks
        for c in range(chunks):
            for i in range(c * per, steps if c == chunks - 1 else (c + 1) * per):
                t0 = rng.randrange(1 << 60)
                rec = {
                    "t": "steps",
                    "step": i,
                    "start_ns": t0,
                    "end_ns": t0 + rng.randrange(1 << 30),
                }
                rec.update(loss=rng.random(), tokens=rng.randrange(1 << 20), lr=1e-3, rss_bytes=i)
                f.write(json.dumps(rec, separators=(",", ":")) + "\n")
            f.flush()
            time.sleep(pause_s)
    return steps


def agent_for(spool: Path, store, **cfg) -> Agent:
    return Agent(str(spool), store, config=AgentConfig(stats_interval_s=0, fsync=False, **cfg))


@pytest.fixture
def chdb(chdb_url):
    store = open_store(chdb_url)
    store.init_schema()
    return store


def steps_stored(store) -> tuple[int, int]:
    row = store.query("SELECT count() AS n, uniqExact(step) AS u FROM steps").iloc[0]
    return int(row["n"]), int(row["u"])


def test_batches_are_sealed_whole_and_survive_a_restart_before_shipping(tmp_path, chdb) -> None:
    spool = tmp_path / "spool"
    write_spool(spool, "r", steps=2500)
    a = agent_for(spool, chdb, batch_rows=1000)
    assert a.read_once() == 2500
    assert a.buffer.seqs() == [1, 2, 3] and a.buffer.size[0] == 2500
    a.close()
    b = agent_for(spool, chdb, batch_rows=1000)  # a restart: nothing is read twice
    assert b.read_once() == 0 and b.buffer.size[0] == 2500
    assert b.drain() == 2500 and steps_stored(chdb) == (2500, 2500)
    assert b.buffer.seqs() == []


def test_crash_between_seal_and_offsets_commit_repeats_nothing(tmp_path, chdb) -> None:
    spool = tmp_path / "spool"
    write_spool(spool, "r", steps=1200)
    a = agent_for(spool, chdb, batch_rows=1000)
    offsets = Path(a.state_dir) / OFFSETS
    a.read_once()
    a.close()
    saved = json.loads(offsets.read_text())
    saved["seq"], saved["files"] = 0, {}  # as if the agent died right after sealing
    offsets.write_text(json.dumps(saved))
    b = agent_for(spool, chdb, batch_rows=1000)
    assert b.read_once() == 0, "the sealed batches' manifests carry their offsets"
    assert b.drain() == 1200 and steps_stored(chdb) == (1200, 1200)


def test_a_second_agent_on_the_same_spool_and_store_is_refused(tmp_path, chdb) -> None:
    a = agent_for(tmp_path / "spool", chdb)
    with pytest.raises(RuntimeError, match="another ranksight agent"):
        agent_for(tmp_path / "spool", chdb)
    a.close()
    agent_for(tmp_path / "spool", chdb).close()


@pytest.mark.parametrize("policy", ["drop_oldest", "drop_newest"])
def test_a_full_buffer_drops_by_policy_and_counts_every_record(tmp_path, chdb, policy) -> None:
    spool = tmp_path / "spool"
    write_spool(spool, "r", steps=40_000)
    a = agent_for(spool, chdb, batch_rows=4000, buffer_bytes=300_000, drop_policy=policy)
    assert a.read_once() == 40_000
    rows, size = a.buffer.size
    assert a.stats.dropped == 40_000 - rows > 0 and a.stats.dropped_by_table == {
        "steps": a.stats.dropped
    }
    assert size <= 300_000
    a.drain()
    stored = chdb.query("SELECT step FROM steps ORDER BY step")["step"].tolist()
    assert len(stored) == rows == len(set(stored))
    if policy == "drop_oldest":  # the newest survive: the last batch, not the first
        assert stored[-1] == 39_999 and stored[0] > 0
    else:  # the oldest survive: the first batch (3999 records after the header) whole
        assert stored[:3999] == list(range(3999)) and len(stored) < 39_999


def test_half_written_and_half_deleted_batches_are_cleared_at_start(tmp_path) -> None:
    import pyarrow as pa

    buf = DiskBuffer(tmp_path, 1 << 20, "drop_oldest", fsync=False)
    buf.seal(1, {"steps": pa.table({"step": [1, 2]})}, {})
    (buf.folder / ".000000000002.tmp").mkdir()  # died while writing batch 2
    (buf.folder / ".000000000000.gone").mkdir()  # died while deleting batch 0
    again = DiskBuffer(tmp_path, 1 << 20, "drop_oldest", fsync=False)
    assert again.seqs() == [1] and sorted(os.listdir(again.folder)) == ["000000000001"]
    assert again.load(1).tables["steps"].column("step").to_pylist() == [1, 2]


def test_spool_folder_is_owner_only(tmp_path, chdb) -> None:
    spool = tmp_path / "spool"
    spool.mkdir(mode=0o755)
    os.chmod(spool, 0o755)
    agent_for(spool, chdb).close()
    assert spool.stat().st_mode & 0o777 == 0o700


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("interval_s", 0, "interval_s must be > 0"),
        ("batch_rows", 2_000_000, "batch_rows must be in 1..1000000"),
        ("buffer_bytes", 10, "buffer_bytes must be >= 65536"),
        ("drop_policy", "drop_random", "is not one of drop_oldest, drop_newest"),
        ("settle_s", -1, "settle_s must be >= 0"),
    ],
)
def test_agent_config_rejects_bad_values_naming_them(field, value, says) -> None:
    with pytest.raises(ValueError, match=says):
        AgentConfig(**{field: value})


def test_a_burst_of_batches_is_sealed_fast_and_a_lasting_backlog_dense(
    tmp_path, monkeypatch
) -> None:
    """Several batches sealed faster than they are shipped stay uncompressed Arrow IPC;
    once the oldest has waited over BACKLOG_S, or the buffer holds over an eighth of its
    bound, new batches are zstd Parquet (and both read back the same)."""
    import pyarrow as pa

    from ranksight.agent import buffer as buffer_mod

    rows = pa.table({"step": pa.array(range(1000), pa.uint32())})
    buffer = DiskBuffer(tmp_path, 1 << 30, "drop_oldest", fsync=False, keep_in_memory=0)

    def kind(seq: int) -> str:
        return {p.suffix for p in (buffer.folder / f"{seq:012d}").glob("steps.*")}.pop()

    for seq in range(1, 7):
        buffer.seal(seq, {"steps": rows}, {})
    assert [kind(s) for s in range(1, 7)] == [".arrow"] * 6
    monkeypatch.setattr(buffer_mod, "BACKLOG_S", 0.0)  # batch 1 has now waited too long
    buffer.seal(7, {"steps": rows}, {})
    assert kind(7) == ".parquet"
    monkeypatch.setattr(buffer_mod, "BACKLOG_S", 5.0)
    for seq in range(1, 8):
        buffer.remove(seq)
    buffer.seal(8, {"steps": rows}, {})
    assert kind(8) == ".arrow"
    small = DiskBuffer(tmp_path / "small", 8 * buffer.size[1] - 100, "drop_oldest", False, 0)
    small.seal(1, {"steps": rows}, {})
    small.seal(2, {"steps": rows}, {})  # the buffer holds over an eighth of its bound
    assert [p.suffix for p in sorted(small.folder.glob("*/steps.*"))] == [".arrow", ".parquet"]
    for seq in (1, 2):
        assert buffer_mod.read_batch(small.folder, seq).tables["steps"].equals(rows)
