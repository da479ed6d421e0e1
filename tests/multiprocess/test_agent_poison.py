"""A poisoned spool (a record or frame that breaks decoding: nested 100k deep, a row count
no payload can hold, a decoder that raises) is quarantined, counted and logged once, and
every other record, of that segment and of every other rank, is stored."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ranksight.agent import Agent, AgentConfig
from ranksight.agent import segment as segment_mod
from ranksight.agent.parse import Parsed
from ranksight.agent.tailer import SpoolTailer
from ranksight.store import open_store
from ranksight.trainer_hooks import spool_format as sf
from ranksight.trainer_hooks.spool import SpoolWriter, spool_path
from tests.multiprocess.test_agent_parse import coll, step

RUN = "run-p"
DEEP = b"[" * 100_000 + b"]" * 100_000


def real_segment(spool: Path, rank: int, frames: int = 3, per: int = 100) -> Path:
    """A closed segment written by the hooks' writer: ``frames`` flushes of ``per`` step
    records (``step`` 0..), one COLUMNS frame each."""
    header = {"run_id": RUN, "attempt": 0, "rank": rank}
    writer = SpoolWriter(spool_path(str(spool), RUN, 0, rank), header, max_buffered=10**6,
                         budget_bytes=1 << 30, flush_interval_s=3600)  # fmt: skip
    for k in range(frames):
        for i in range(k * per, (k + 1) * per):
            writer.put(step(i))
        writer._drain()
    writer.close()
    return Path(writer.path)


def split_frames(path: Path) -> list[bytes]:
    data = path.read_bytes()
    return [data[f.start : f.end] for f in sf.frames(data)]


def reframed(raw: bytes, **change) -> bytes:
    """Frame ``raw`` again with fields changed, its checksum valid."""
    item = next(sf.frames(raw))
    fields = {
        "kind": item.kind,
        "name": item.name,
        "rows": item.rows,
        "payload": bytes(item.payload),
    }
    fields.update(change)
    return sf.frame(fields["kind"], fields["name"], fields["rows"], fields["payload"])


def with_field(raw: bytes, index: int, value: int) -> bytes:
    """Frame ``raw`` with field ``index`` of its header (``spool_format.FRAME``: magic,
    kind, name length, rows, payload length, crc) set to ``value``, checksum untouched."""
    fields = list(sf.FRAME.unpack_from(raw, 0))
    fields[index] = value
    return sf.FRAME.pack(*fields) + raw[sf.FRAME_BYTES :]


ROWS, LENGTH = 3, 4


def poisoned_spool(spool: Path) -> dict[int, int]:
    """Five ranks' spool files, four of them poisoned; the step records each should store."""
    real_segment(spool, 0)  # clean
    one = real_segment(spool, 1)  # its header frame nested 100k deep
    frames = split_frames(one)
    frames[0] = sf.frame(sf.HEADER, "_header", 0, b'{"run_id": "x", "deep": ' + DEEP + b"}")
    one.write_bytes(b"".join(frames))
    two = real_segment(spool, 2)  # a JSON-lines frame with one line nested 100k deep
    frames = split_frames(two)
    lines = b"\n".join([json.dumps(step(1000)).encode(), DEEP, json.dumps(step(1001)).encode()])
    frames.insert(2, sf.frame(sf.JSON_LINES, "steps", 3, lines))
    two.write_bytes(b"".join(frames))
    three = real_segment(spool, 3)  # rows 0xFFFFFFFF: one with a valid checksum, one without
    frames = split_frames(three)
    frames[2] = reframed(frames[2], rows=0xFFFFFFFF)
    frames[1] = with_field(frames[1], ROWS, 0xFFFFFFFF)
    three.write_bytes(b"".join(frames))
    four = spool / RUN / "a0" / "rank00004-1.jsonl"  # JSON lines, one nested 100k deep
    header = {"t": "_header", "run_id": RUN, "attempt": 0, "rank": 4}
    good = [json.dumps(r).encode() for r in [header, *map(step, range(50))]]
    more = [json.dumps(step(i)).encode() for i in range(50, 100)]
    four.write_bytes(b"\n".join([*good, DEEP, *more]) + b"\n")
    return {0: 300, 1: 300, 2: 302, 3: 100, 4: 100}


def stored_per_rank(store) -> dict[int, int]:
    frame = store.query(
        "SELECT rank, count() AS n, uniqExact(step) AS u FROM steps WHERE run_id = %(r)s "
        "GROUP BY rank ORDER BY rank",
        {"r": RUN},
    )
    assert (frame["n"] == frame["u"]).all(), "a step stored twice"
    return dict(zip(frame["rank"].tolist(), frame["n"].tolist(), strict=True))


def agent_once(spool: Path, url: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "ranksight.cli", "agent", "--once", "--spool", str(spool)]
    cmd += ["--store", url, "--collectors", "none"]
    env = {k: v for k, v in os.environ.items() if k != "RANKSIGHT_STORE"}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env)


def test_a_poisoned_spool_is_quarantined_and_every_rank_still_ships(tmp_path, chdb_url) -> None:
    spool = tmp_path / "spool"
    want = poisoned_spool(spool)
    first = agent_once(spool, chdb_url)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-3000:]
    assert "Traceback" not in first.stderr, first.stderr[-3000:]
    store = open_store(chdb_url)
    assert stored_per_rank(store) == want
    ids = store.query("SELECT DISTINCT run_id, attempt FROM steps WHERE rank = 1")
    assert ids.values.tolist() == [[RUN, 0]], "a poisoned header: identity from the path"
    stats = store.query("SELECT max(quarantined) AS q, max(rejected) AS r FROM agent_stats")
    assert stats["q"].tolist() == [4], "header, JSON line, frame of 2^32 rows, .jsonl line"
    assert 1 <= stats["r"].tolist()[0] <= 1000, "a damaged frame: at most a row per 8 bytes"
    folder = glob.glob(str(spool / ".agent-*" / "quarantine"))
    assert len(folder) == 1
    kept = sorted(p for p in os.listdir(folder[0]) if p.endswith(".bad"))
    assert len(kept) == 4, kept
    contents = [Path(folder[0], p).read_bytes() for p in kept]
    assert sum(DEEP in c for c in contents) == 3, "each nested item kept whole"
    logged = [line for line in first.stderr.splitlines() if "quarantined" in line]
    assert len(logged) == 4 and all(os.path.basename(folder[0]) in x for x in logged), logged
    again = agent_once(spool, chdb_url)  # the offsets are past them: nothing twice
    assert again.returncode == 0, again.stderr[-3000:]
    assert not [line for line in again.stderr.splitlines() if "quarantined" in line]
    assert stored_per_rank(store) == want


def test_a_decoder_that_raises_costs_only_its_frame(tmp_path, chdb_url, monkeypatch) -> None:
    """Any exception from decoding one frame, not only the ones foreseen, is caught:
    that frame is quarantined, the frames read with it and the other ranks are stored."""
    spool = tmp_path / "spool"
    for rank in range(3):
        real_segment(spool, rank)
    path = spool_path(str(spool), RUN, 0, 3)
    writer = SpoolWriter(path, {"run_id": RUN, "attempt": 0, "rank": 3}, max_buffered=10**6,
                         budget_bytes=1 << 30, flush_interval_s=3600)  # fmt: skip
    for i in range(100):
        writer.put(coll(i))
    writer.close()
    real = segment_mod.check_columns

    def broken(name, rows, base, out):
        if name == "collectives":
            raise KeyError("a bug in the checks")
        return real(name, rows, base, out)

    monkeypatch.setattr(segment_mod, "check_columns", broken)
    store = open_store(chdb_url)
    store.init_schema()
    agent = Agent(str(spool), store, config=AgentConfig(stats_interval_s=0, fsync=False))
    agent.drain()
    assert stored_per_rank(store) == {0: 300, 1: 300, 2: 300}
    assert agent.stats.quarantined == 100, "the collectives frame's records"
    assert len(glob.glob(os.path.join(agent.state_dir, "quarantine", "*.bad"))) == 1


@pytest.mark.parametrize("claimed", [0xFFFFFFFF, 1 << 20])
def test_a_row_count_its_payload_cannot_hold_is_quarantined_not_allocated(
    tmp_path, claimed
) -> None:
    spool = tmp_path / "spool"
    path = real_segment(spool, 0)
    frames = split_frames(path)
    for kind in (1, 2):
        frames[kind] = reframed(frames[kind], rows=claimed)
    frames.insert(2, sf.frame(sf.JSON_LINES, "steps", claimed, json.dumps(step(7)).encode()))
    path.write_bytes(b"".join(frames))
    got = SpoolTailer(str(spool)).read()
    assert got.tables["steps"].column("step").to_pylist() == list(range(200, 300))
    assert len(got.quarantined) == 3 and not got.rejected


def test_a_length_past_the_end_costs_only_its_frame_once_the_writer_is_gone(
    tmp_path, monkeypatch
) -> None:
    """A damaged length field makes a frame look unfinished; once its writer is gone the
    reader skips to the next frame instead of taking the rest of the segment for it."""
    from ranksight.agent import tailer as tailer_mod

    spool = tmp_path / "spool"
    frames = split_frames(real_segment(spool, 0, frames=4))
    frames[2] = with_field(frames[2], LENGTH, 1 << 29)  # payload length: 512 MiB
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    path = spool / RUN / "a0" / f"rank00000-{int(dead.stdout)}-0000.spool"
    for old in path.parent.iterdir():
        old.unlink()
    path.write_bytes(b"".join(frames))
    monkeypatch.setattr(tailer_mod, "_QUIET_S", 0.0)
    tailer = SpoolTailer(str(spool))
    got = Parsed()
    for _ in range(3):
        got.extend(tailer.read())
        tailer.commit()
    steps = got.tables["steps"].column("step").to_pylist()
    assert steps == list(range(100)) + list(range(200, 400))
    assert len(got.rejected) == 1 and "runs past the end" in got.rejected[0], got.rejected
