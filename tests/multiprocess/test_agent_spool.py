"""The binary spool: what the hooks' writer encodes the agent reads back exactly (the same
rows and rejections as the record-by-record reference), damaged or truncated frames are
rejected and counted while the rest is stored, and segments are deleted once, and only
once, the store has every record in them."""

from __future__ import annotations

import contextlib
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ranksight.agent import Agent, AgentConfig
from ranksight.agent import tailer as tailer_mod
from ranksight.agent.parse import parse_lines
from ranksight.agent.tailer import SpoolTailer
from ranksight.store import open_store
from ranksight.trainer_hooks import spool_format as sf
from ranksight.trainer_hooks.spool import SpoolWriter, spool_path
from tests.multiprocess.test_agent_parse import BAD, HEADER, canonical, coll, prefix, step

BASE = {k: HEADER[k] for k in ("run_id", "attempt", "rank")}


def segment(folder: Path, frames: list[bytes], pid: int = 1, n: int = 0) -> Path:
    """A segment file of rank 3 (pid ``pid``, number ``n``) holding ``frames``."""
    path = folder / "run-x" / "a2" / f"rank00003-{pid}-{n:04d}.spool"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(sf.header_frame(BASE) + b"".join(frames))
    return path


@pytest.mark.parametrize("seed", range(4))
def test_binary_segments_read_back_like_the_record_by_record_reference(tmp_path, seed) -> None:
    rng = random.Random(seed)
    bad = [b for b in BAD if isinstance(b, dict)]
    records = []
    for i in range(600):
        good = [step(i), coll(i), step(i, loss=1), coll(i, peer=-1), step(i, step=1 << 40)]
        good += [step(i, tokens=2.0), step(i, tokens=2.5), coll(i, phase="前向")]
        records.append(rng.choice(good) if rng.random() < 0.9 else rng.choice(bad))
    cuts = sorted(rng.sample(range(1, len(records)), 12))
    chunks = [records[a:b] for a, b in zip([0, *cuts], [*cuts, len(records)], strict=True)]
    segment(tmp_path, [sf.encode(c) for c in chunks])
    got = SpoolTailer(str(tmp_path)).read()
    reference = parse_lines(b"\n".join(json.dumps(r).encode() for r in [HEADER, *records]), None)
    assert canonical(got.tables) == canonical(reference.tables)
    assert prefix(got.rejected) == prefix(reference.rejected)
    assert got.count + len(got.rejected) == len(records)


def test_damaged_and_truncated_frames_are_rejected_counted_and_the_rest_stored(
    tmp_path, chdb_url, monkeypatch, caplog
) -> None:
    import logging

    frames = [sf.encode([step(i) for i in range(k, k + 10)]) for k in range(0, 50, 10)]
    damaged = bytearray(frames[1])
    damaged[-20] ^= 0xFF  # a flipped bit inside the payload: the checksum catches it
    garbage = b"\x00\xffnot a frame at all\x00\x00"  # a stretch that is no frame
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    pid = int(dead.stdout)  # a writer that is gone
    parts = [frames[0], bytes(damaged), frames[2], garbage, frames[3]]
    path = segment(tmp_path / "spool", parts, pid)
    with open(path, "ab") as f:
        f.write(frames[4][:-12])  # the writer died in the middle of its last frame
    store = open_store(chdb_url)
    store.init_schema()
    agent = Agent(str(tmp_path / "spool"), store, config=AgentConfig(stats_interval_s=0))
    agent.drain()
    assert agent.stats.rejected == 11  # the damaged frame's 10 records and the garbage
    got = store.query("SELECT step FROM steps ORDER BY step")["step"].tolist()
    assert got == list(range(10)) + list(range(20, 40))
    assert path.exists(), "a recent segment of a writer that may still be writing is kept"
    monkeypatch.setattr(tailer_mod, "_QUIET_S", 0.0)  # as if it had not grown for a while
    monkeypatch.setattr(tailer_mod, "ABANDONED_S", 0.0)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="ranksight.agent"):
        agent.drain()
        agent.read_once()
    reasons = [r.getMessage() for r in caplog.records if "rejected record" in r.message]
    assert len(reasons) == 1 and "truncated frame" in reasons[0] and "writer gone" in reasons[0]
    assert agent.stats.rejected == 12
    assert not path.exists(), "read to its end, writer gone, every record stored: deleted"
    assert store.query("SELECT count() AS n FROM steps")["n"].tolist() == [30]


def test_a_frame_with_bad_strings_is_rejected_and_the_frames_read_with_it_kept(tmp_path) -> None:
    """The frames of one read are checked together (one array per column); a frame whose
    checksum holds but whose strings do not (not UTF-8, offsets out of order) costs its
    own records only."""

    def with_payload(frame: bytes, change) -> bytes:
        item = next(f for f in sf.frames(frame) if isinstance(f, sf.Frame))
        payload = bytearray(item.payload)
        change(payload)
        return sf.frame(sf.COLUMNS, item.name, item.rows, bytes(payload))

    def not_utf8(payload: bytearray) -> None:
        payload[payload.index(b"forward")] = 0xFF

    def offsets_backwards(payload: bytearray) -> None:
        cols = sf.decode_columns(memoryview(bytes(payload)), 10)
        offsets = next(a for name, kind, a, _ in cols if name == "phase")
        at = bytes(payload).index(offsets.tobytes())
        payload[at + 4 : at + 8] = int(offsets[3]).to_bytes(4, "little")  # 0, 21, 14, ...

    frames = [sf.encode([coll(i) for i in range(k, k + 10)]) for k in range(0, 50, 10)]
    frames[1] = with_payload(frames[1], not_utf8)
    frames[3] = with_payload(frames[3], offsets_backwards)
    segment(tmp_path, frames)
    got = SpoolTailer(str(tmp_path)).read()
    assert len(got.rejected) == 20
    assert all("bad collectives frame" in reason for reason in got.rejected)
    kept = got.tables["collectives"]
    assert kept.column("step").to_pylist() == list(range(10)) + list(range(20, 30)) + list(
        range(40, 50)
    )
    assert set(kept.column("phase").to_pylist()) == {"forward"}
    assert kept.column("run_id").to_pylist() == [BASE["run_id"]] * 30


def write_records(writer: SpoolWriter, n: int, start: int = 0) -> None:
    for i in range(start, start + n):
        writer.put(step(i))


def test_segments_are_deleted_only_once_the_store_has_every_record_in_them(
    tmp_path, chdb_url
) -> None:
    spool = tmp_path / "spool"
    writer = SpoolWriter(spool_path(str(spool), "run-x", 2, 3), BASE, max_buffered=10**6,
                         budget_bytes=1 << 30, flush_interval_s=0.01, segment_bytes=4096)  # fmt: skip
    for k in range(10):
        write_records(writer, 300, start=300 * k)
        time.sleep(0.05)
    time.sleep(0.2)
    store = open_store(chdb_url)
    store.init_schema()
    agent = Agent(str(spool), store, config=AgentConfig(stats_interval_s=0, batch_rows=500))
    folder = spool / "run-x" / "a2"
    before = sorted(os.listdir(folder))
    assert len(before) > 3, "the writer moved on to new segments past 4 KiB"
    agent.read_once()  # sealed into the disk buffer, not stored yet: nothing is deleted
    assert agent.buffer.seqs() and sorted(os.listdir(folder)) == before
    while agent.ship_once():  # stored
        pass
    deleted = agent.delete_stored_segments()
    left = sorted(os.listdir(folder))
    assert len(deleted) == len(before) - 1 and left == [before[-1]], "all but the open one"
    write_records(writer, 1000, start=3000)
    writer.close()
    time.sleep(0.1)
    agent.read_once()
    agent.close()
    restarted = Agent(str(spool), store, config=AgentConfig(stats_interval_s=0))
    restarted.drain()  # shipped, then killed before deleting: the next agent deletes
    restarted.read_once()
    assert os.listdir(folder) == []
    n = store.query("SELECT count() AS n, uniqExact(step) AS u FROM steps").iloc[0].tolist()
    assert n == [4000, 4000] and writer.dropped == 0 and writer.records == 4000


def test_a_segment_another_running_agent_has_not_read_is_kept(tmp_path, chdb_url) -> None:
    spool = tmp_path / "spool"
    path = segment(spool, [sf.encode([step(i) for i in range(5)]), sf.end_frame(5)])
    stores = [open_store(chdb_url), open_store(str(tmp_path / "second"))]
    for s in stores:
        s.init_schema()
    first, second = (Agent(str(spool), s, config=AgentConfig(stats_interval_s=0)) for s in stores)
    first.drain()
    first.read_once()
    assert path.exists(), "the second agent (another store) has not read it yet"
    second.drain()
    second.read_once()
    assert not path.exists()
    second.close()
    first.close()


def test_the_writer_budget_counts_only_segments_still_on_disk(tmp_path) -> None:
    spool = tmp_path / "spool"
    writer = SpoolWriter(spool_path(str(spool), "run-x", 2, 3), BASE, max_buffered=10**6,
                         budget_bytes=64 << 10, flush_interval_s=3600, segment_bytes=8 << 10)  # fmt: skip
    for k in range(40):  # about 20 KiB a round; the agent deletes segments in rounds 0-19
        write_records(writer, 300, start=300 * k)
        writer._drain()
        if k < 20:
            for path in sorted(spool.glob("run-x/a2/*.spool"))[:-1]:
                path.unlink()
        if k == 19:
            assert writer.dropped == 0, "deleted segments no longer count"
    assert writer.dropped > 0 and writer.records + writer.dropped == 40 * 300
    on_disk = sum(p.stat().st_size for p in spool.glob("run-x/a2/*.spool"))
    assert on_disk <= 64 << 10
    writer.close()


def test_a_record_put_while_the_writer_rotates_segments_is_kept(tmp_path) -> None:
    """The training thread may put a record while the writer thread is between two
    segments (the old one closed, the next not yet open); it waits for the next one."""
    spool = tmp_path / "spool"
    writer = SpoolWriter(spool_path(str(spool), "run-r", 0, 1), BASE, max_buffered=10**6,
                         budget_bytes=1 << 30, flush_interval_s=3600, segment_bytes=4 << 10)  # fmt: skip
    opened = writer._open

    def open_during_a_put(path: str):  # the put lands in the rotation's window
        write_records(writer, 1, start=10**6 + len(list(spool.glob("run-r/a0/*.spool"))))
        return opened(path)

    writer._open = open_during_a_put
    for k in range(10):
        write_records(writer, 100, start=100 * k)
        writer._drain()
    rotations = len(list(spool.glob("run-r/a0/*.spool"))) - 1
    writer.close()
    assert rotations >= 3
    assert writer.dropped == 0
    assert writer.records == 1000 + rotations


def test_the_agent_on_a_chdb_store_never_loads_the_chdb_engine(tmp_path) -> None:
    """Writing needs pyarrow only (schema version, retried-batch checks included): the
    engine (~200 MB resident) stays out of the node agent."""
    spool = tmp_path / "spool"
    segment(spool, [sf.encode([step(i) for i in range(5)]), sf.end_frame(5)])
    code = f"""
import sys
from ranksight.agent import Agent, AgentConfig
from ranksight.store import open_store
store = open_store({str(tmp_path / "store")!r})
store.init_schema()
agent = Agent({str(spool)!r}, store, config=AgentConfig(stats_interval_s=0))
agent.read_once()
seq = agent.buffer.seqs()[0]
agent.buffer.mark_attempted(seq)  # as if an earlier insert may have landed: checked first
assert agent.drain() == 5 and agent.ship_once() == 0
assert store.stored_batches("steps", [1, 2]) == {{}} and store.schema_version() > 0
print("chdb" in sys.modules, "torch" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["False", "False"]
    got = open_store(str(tmp_path / "store")).query("SELECT count() AS n FROM steps")
    assert got["n"].tolist() == [5]


def test_a_compaction_dying_just_before_a_read_is_finished_not_counted_twice(
    tmp_path, monkeypatch
) -> None:
    """A compaction that dies mid-swap between a reader's check for an interrupted one and
    its shared lock leaves merged and replaced segments side by side: the reader checks
    again under the lock and finishes the compaction first."""
    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ranksight.store import segments

    store = open_store(str(tmp_path / "store"))
    store.init_schema()
    for i in range(3):
        store.insert("steps", pd.DataFrame({"run_id": "c", "step": [i]}))
    folder = tmp_path / "store" / "steps"
    olds = sorted(p for p in folder.glob("*.parquet") if pq.read_metadata(p).num_rows)
    real_lock, died = segments.store_lock, []

    @contextlib.contextmanager
    def lock_after_a_dying_compaction(where, exclusive):
        if not exclusive and not died:  # the compaction dies right now, mid-swap
            died.append(True)
            merged = pa.concat_tables(pq.read_table(p) for p in olds)
            pq.write_table(merged, folder / "9-9-9.parquet")
            plan = {"merged": "9-9-9.parquet", "replaced": [p.name for p in olds]}
            (folder / "compact.intent").write_text(json.dumps(plan))
        with real_lock(where, exclusive):
            yield

    monkeypatch.setattr(segments, "store_lock", lock_after_a_dying_compaction)
    assert store.query("SELECT count() AS n FROM steps")["n"].tolist() == [3]
    assert died and not (folder / "compact.intent").exists()


def test_a_piece_over_the_atomic_insert_size_goes_as_chunks_each_stored_once(
    tmp_path, monkeypatch
) -> None:
    import pandas as pd

    from ranksight.agent import deliver as deliver_mod

    monkeypatch.setattr(deliver_mod, "MAX_ATOMIC_ROWS", 1000)
    store = open_store(str(tmp_path / "store"))
    store.init_schema()
    agent = Agent(str(tmp_path / "spool"), store, config=AgentConfig(stats_interval_s=0))
    agent.submit("steps", pd.DataFrame({"run_id": "big", "step": range(2500)}))
    agent.read_once()
    batch = agent.buffer.load(agent.buffer.seqs()[0])
    parts = deliver_mod.pieces(store, "steps", batch.uid, batch.tables["steps"])
    assert [p.num_rows for _, p in parts] == [1000, 1000, 500] and len({i for i, _ in parts}) == 3
    first = deliver_mod.deliver(store, batch, verify=False, settle_s=5)
    again = deliver_mod.deliver(store, batch, verify=True, settle_s=5)  # a retry after it landed
    assert (first.inserted, again.inserted, again.already_stored) == (2500, 0, 2500)
    got = store.query("SELECT count() AS n, uniqExact(step) AS u FROM steps WHERE run_id = 'big'")
    assert got.iloc[0].tolist() == [2500, 2500]
    agent.close()


def test_the_stall_watcher_tells_progress_from_snapshots_in_binary_segments(tmp_path) -> None:
    from ranksight.agent.stall import appended_progress

    path = segment(tmp_path, [])
    snapshot = {"t": "progress", "ts_ns": 1, "step": 1, "group_id": "g", "issued_seq": 5}
    offset, moved = appended_progress(str(path), None)  # the first look finds the end
    assert offset == path.stat().st_size and not moved
    with open(path, "ab") as f:
        f.write(sf.encode([snapshot, {**snapshot, "ts_ns": 2}]))
    offset, moved = appended_progress(str(path), offset)
    assert offset == path.stat().st_size and not moved, "only snapshots: no progress"
    with open(path, "ab") as f:
        f.write(sf.encode([snapshot, step(1)]))
        f.write(sf.encode([step(2)])[:-5])  # a frame still being written
    offset, moved = appended_progress(str(path), offset)
    assert moved and offset == path.stat().st_size - len(sf.encode([step(2)])) + 5
