"""The node agent's Flight Recorder collector on bad and foreign dumps: a gzip bomb is
refused within the dump limit, a dump that breaks a reader never costs the good dump
beside it, a file name that is no UTF-8 stores all its rows, and dumps another user
wrote (or may write) into a shared folder are skipped and named; the hooks point torch's
dumps at the run's private folder, where the collector finds them."""

from __future__ import annotations

import gzip
import logging
import os
import pickle
import shutil
import stat
import tracemalloc
import zlib

import pytest

from ranksight.collectors import fr_ingest
from ranksight.collectors.base import NodeContext, frame
from ranksight.collectors.flight_recorder import read_dump
from ranksight.collectors.fr_ingest import FrCollector
from ranksight.store import open_store

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOOD = os.path.join(TESTS, "data", "fr", "nccl_h200x2", "nccl_trace_rank_0.gz")
ENTRIES = len(read_dump(GOOD).entries)


def collected(folder, spool: str = "") -> tuple[FrCollector, dict]:
    """Two polls of a collector on ``<folder>/nccl_trace_rank_*`` (a dump is taken once
    stable across two)."""
    c = FrCollector(NodeContext(host="h", spool_dir=spool),
                    prefixes=(os.path.join(str(folder), "nccl_trace_rank_"),))  # fmt: skip
    c.open()
    c.collect(0)
    return c, c.collect(0)


def per_source(rows: dict) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in rows.get("fr_entries", []):
        out[os.path.basename(r["source"])] = out.get(os.path.basename(r["source"]), 0) + 1
    return out


def test_gzip_bomb_is_refused_within_the_limit(tmp_path) -> None:
    """256 MiB inflated from 256 KiB (a pickle's first byte): the collector holds at most
    the 8 MiB dump limit of it, names the limit in the dump's problems, and stores the good
    dump beside it."""
    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    with open(tmp_path / "nccl_trace_rank_1", "wb") as f:
        f.write(z.compress(b"\x80\x04"))
        for _ in range(256):
            f.write(z.compress(bytes(1 << 20)))
        f.write(z.flush())
    shutil.copy(GOOD, tmp_path / "nccl_trace_rank_0")
    tracemalloc.start()
    try:
        _, rows = collected(tmp_path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 << 20, f"peak {peak / 2**20:.0f} MiB"
    bomb = next(r for r in rows["fr_dumps"] if r["source"].endswith("rank_1"))
    assert "inflates to more than 8 MiB" in bomb["problems"], bomb["problems"]
    assert per_source(rows) == {"nccl_trace_rank_0": ENTRIES}


def test_a_dump_that_broke_the_reader_does_not_cost_the_good_one(tmp_path) -> None:
    """Entries with lists for ints and non-dict frames (a TypeError before) are read with
    those values unknown; the good dump beside it is stored whole; neither is read twice."""
    with open(GOOD, "rb") as f:
        doc = pickle.loads(gzip.decompress(f.read()))
    doc["entries"] = doc["entries"][:5]
    doc["entries"][0].update(record_id=[1], time_created_ns=float("inf"), frames=[3, None])
    doc["entries"][1].update(collective_seq_id={"a": 1}, input_sizes=7, duration_ms="x")
    doc["pg_status"] = {"0": "no dict", "1": [1]}
    (tmp_path / "nccl_trace_rank_1").write_bytes(pickle.dumps(doc))
    shutil.copy(GOOD, tmp_path / "nccl_trace_rank_0")
    c, rows = collected(tmp_path)
    assert per_source(rows) == {"nccl_trace_rank_0": ENTRIES, "nccl_trace_rank_1": 5}
    bad = [r for r in rows["fr_entries"] if r["source"].endswith("rank_1")]
    assert (bad[0]["record_id"], bad[0]["time_created_ns"], bad[0]["frames"]) == (-1, 0, "[]")
    assert bad[1]["collective_seq_id"] == -1 and bad[1]["input_sizes"] == "[]"
    frame("fr_entries", rows["fr_entries"])  # every value fits its column
    assert c.collect(0) == {}


def test_a_crash_in_one_dump_is_named_and_the_others_kept(tmp_path, monkeypatch, caplog) -> None:
    """Whatever breaks building one dump's rows, the other dump's rows come back, the
    broken one is named (log and ``refused``) and not retried until it changes."""
    shutil.copy(GOOD, tmp_path / "nccl_trace_rank_0")
    shutil.copy(GOOD, tmp_path / "nccl_trace_rank_1")
    real = fr_ingest.read_dump

    def read(path, *a, **k):
        if path.endswith("rank_1"):
            raise MemoryError("as a reader might")
        return real(path, *a, **k)

    monkeypatch.setattr(fr_ingest, "read_dump", read)
    with caplog.at_level(logging.WARNING, logger=fr_ingest.__name__):
        c, rows = collected(tmp_path)
    assert per_source(rows) == {"nccl_trace_rank_0": ENTRIES}
    assert "MemoryError" in c.refused[str(tmp_path / "nccl_trace_rank_1")]
    assert "nccl_trace_rank_1 skipped: cannot be read (MemoryError" in caplog.text
    assert c.collect(0) == {}


def test_a_file_name_that_is_no_utf8_stores_every_row(tmp_path) -> None:
    name = os.fsdecode(b"nccl_trace_rank_0\xff.gz")
    shutil.copy(GOOD, os.path.join(str(tmp_path), name))
    _, rows = collected(tmp_path)
    store = open_store(str(tmp_path / "store"))
    store.init_schema()
    for table in ("fr_dumps", "fr_entries"):
        store.insert(table, frame(table, [{**r, "run_id": "u"} for r in rows[table]]))
    got = store.query("SELECT count() AS n, any(source) AS s FROM fr_entries WHERE run_id = 'u'")
    assert int(got["n"].iloc[0]) == ENTRIES
    assert got["s"].iloc[0].endswith("nccl_trace_rank_0\ufffd.gz")


@pytest.mark.skipif(os.getuid() != 0, reason="chown to another uid needs root")
def test_another_users_dump_is_skipped_and_named(tmp_path, caplog) -> None:
    for rank in range(4):
        shutil.copy(GOOD, tmp_path / f"nccl_trace_rank_{rank}")
    os.chown(tmp_path / "nccl_trace_rank_1", 65534, 65534)
    os.chmod(tmp_path / "nccl_trace_rank_2", 0o646)  # o+w: anyone could have written it
    os.unlink(tmp_path / "nccl_trace_rank_3")
    os.symlink(tmp_path / "nccl_trace_rank_0", tmp_path / "nccl_trace_rank_3")
    with caplog.at_level(logging.WARNING, logger=fr_ingest.__name__):
        c, rows = collected(tmp_path)
    assert per_source(rows) == {"nccl_trace_rank_0": ENTRIES}
    refused = {os.path.basename(p): why for p, why in c.refused.items()}
    assert refused == {
        "nccl_trace_rank_1": f"owned by uid 65534, not this agent's uid {os.getuid()}",
        "nccl_trace_rank_2": "writable by others (mode 646)",
        "nccl_trace_rank_3": "not a regular file (a link, a FIFO or a device)",
    }
    for name, why in refused.items():
        assert f"{tmp_path / name} skipped: {why}" in caplog.text
    assert caplog.text.count("nccl_trace_rank_1 skipped") == 1
    c.collect(0)
    assert caplog.text.count("nccl_trace_rank_1 skipped") == 1, "named once, not every poll"


@pytest.mark.parametrize("umask", [0o022, 0o000])
def test_the_default_dump_prefix_is_the_runs_private_folder(tmp_path, monkeypatch, umask):
    """With no dump path set by the job, the hooks' dumps and torch's go to
    ``<spool>/<run>/a<attempt>/fr/`` (0700 whatever the umask); the collector, told of
    no prefix, finds a dump there and files it under that run."""
    from ranksight.trainer_hooks.flight_recorder import DumpOnRequest

    monkeypatch.delenv("TORCH_FR_DUMP_TEMP_FILE", raising=False)
    monkeypatch.delenv("TORCH_NCCL_DEBUG_INFO_TEMP_FILE", raising=False)
    run_dir = tmp_path / "spool" / "job-7" / "a2"
    run_dir.mkdir(parents=True)
    old = os.umask(umask)
    try:
        d = DumpOnRequest(str(run_dir), 3)
    finally:
        os.umask(old)
    private = run_dir / "fr"
    assert d.path == str(private / "nccl_trace_rank_3")
    assert os.environ["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == str(private / "nccl_trace_rank_")
    assert stat.S_IMODE(os.stat(private).st_mode) == 0o700
    shutil.copy(GOOD, d.path)
    os.chmod(d.path, 0o600)
    c = FrCollector(NodeContext(host="h", spool_dir=str(tmp_path / "spool")),
                    prefixes=(str(tmp_path / "elsewhere_"),))  # fmt: skip
    c.collect(0)
    rows = c.collect(0)
    assert {(r["run_id"], r["attempt"], r["rank"]) for r in rows["fr_dumps"]} == {("job-7", 2, 3)}
    assert len(rows["fr_entries"]) == ENTRIES


def test_a_dump_path_the_job_set_is_left_alone(tmp_path, monkeypatch) -> None:
    from ranksight.trainer_hooks.flight_recorder import DumpOnRequest

    monkeypatch.delenv("TORCH_FR_DUMP_TEMP_FILE", raising=False)
    monkeypatch.setenv("TORCH_NCCL_DEBUG_INFO_TEMP_FILE", str(tmp_path / "mine_"))
    d = DumpOnRequest(str(tmp_path), 1)
    assert d.path == str(tmp_path / "mine_1") and not (tmp_path / "fr").exists()
