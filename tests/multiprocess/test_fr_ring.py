"""The Flight Recorder ring reader (trainer_hooks/fr_ring.py).

Pure tests feed it dumps shaped as torch's NCCL ring writes them (FlightRecorderDetail.hpp
``getCollectiveTrace``): completion, the ``nccl:coalesced`` closer of batched P2P ops,
peers, a ring that wrapped or was reset. The multi-process tests run real gloo ranks with
torch's own ring (``TORCH_FR_BUFFER_SIZE``; gloo entries stay ``scheduled``, so they are
taken as first read): the reader's records equal the wrappers' rows on the same job, and
a ring that wrapped between reads counts exactly the entries it overwrote. The NCCL path
itself runs on a GPU only (bench/gpu_precision.py, bench/RESULTS.md).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import socket
import time
import types

import pytest
import torch

from ranksight.trainer_hooks.collective_log import BlockedClock, CollectiveLog
from ranksight.trainer_hooks.fr_ring import FrRing, Timeline
from ranksight.trainer_hooks.groups import GroupInfo
from tests.helpers.spool import read_spool

KEYS = ("group_id", "group_seq", "op", "peer", "dtype", "numel_in", "numel_out", "bytes")


class _Groups:
    def by_name(self, name: str) -> GroupInfo:
        if name == "gone":
            raise KeyError(name)
        return GroupInfo(f"g{name}", (0, 1) if name == "0" else (4, 6))


class _Ring:
    """A dump function over a list of entries, keeping the last ``size``."""

    def __init__(self, size: int = 8) -> None:
        self.size, self.entries, self.next_id = size, [], 0

    def add(self, name: str, pg: str = "0", *, state: str = "completed", seq: int = 0,
            p2p: bool = False, dur: float | None = 0.5, done_ns: int = 2_000_000) -> dict:  # fmt: skip
        e = {"record_id": self.next_id, "process_group": (pg, ""), "pg_id": {"0": 0, "1": 1}.get(pg, 9), "profiling_name": name,
             "collective_seq_id": 0 if p2p else seq, "p2p_seq_id": seq if p2p else 0,
             "is_p2p": p2p, "time_created_ns": 1_000_000 + self.next_id, "input_sizes": [[4, 8]],
             "input_dtypes": ["BFloat16"], "output_sizes": [[4, 8]], "output_dtypes": ["BFloat16"],
             "state": state, "time_discovered_started_ns": None,
             "time_discovered_completed_ns": done_ns if state == "completed" else None}  # fmt: skip
        if dur is not None:
            e["duration_ms"] = dur
        self.next_id += 1
        self.entries = (self.entries + [e])[-self.size :]
        return e

    def __call__(self) -> bytes:
        status: dict[str, dict] = {}
        for e in self.entries:
            status[str(e["pg_id"])] = {"last_enqueued_collective": e["collective_seq_id"]}
        return pickle.dumps({"version": "2.10", "pg_config": {"0": {}}, "pg_status": status,
                             "entries": self.entries})  # fmt: skip


def _reader(ring: _Ring, **kw) -> tuple[FrRing, list[dict], CollectiveLog]:
    out: list[dict] = []
    log = CollectiveLog(out.append, lambda: (0, ""), BlockedClock())
    log.groups = _Groups()  # type: ignore[assignment]
    return FrRing(log, out.append, ring, **kw), out, log


def test_entries_before_attach_are_skipped_and_completed_ones_become_rows():
    ring = _Ring()
    ring.add("nccl:all_reduce", seq=1)  # before attach
    reader, out, log = _reader(ring)
    ring.add("nccl:all_reduce", seq=2)
    ring.add("nccl:_allgather_base", seq=3, state="scheduled")
    assert reader.read() == 1
    (rec,) = out
    assert rec["op"] == "all_reduce" and rec["group_seq"] == 0 and rec["group_id"] == "g0"
    assert (rec["dtype"], rec["numel_in"], rec["bytes"]) == ("bfloat16", 32, 64)
    assert rec["end_ns"] == 2_000_000 and rec["start_ns"] == 1_500_000  # end - 0.5 ms
    assert rec["enqueue_ns"] == 1_000_001
    ring.entries[-1]["state"] = "completed"
    ring.entries[-1]["time_discovered_completed_ns"] = 3_000_000
    assert reader.read() == 1 and out[1]["op"] == "all_gather" and out[1]["group_seq"] == 1
    assert log.progress[("g0", "", -1)][1:3] == [1, 1] and log.issued == 2


def test_batched_p2p_members_take_the_coalesced_closer_and_name_their_peers():
    ring = _Ring()
    reader, out, log = _reader(ring)
    ring.add("nccl:send 0->1", "1", state="scheduled", seq=1, p2p=True, dur=None)
    ring.add("nccl:recv 0<-1", "1", state="scheduled", seq=1, p2p=True, dur=None)
    closer = ring.add("nccl:coalesced", "1", state="scheduled", seq=1, p2p=True)
    assert reader.read() == 0 and out == []
    closer.update(state="completed", time_discovered_completed_ns=5_000_000)
    assert reader.read() == 2
    assert [(r["op"], r["peer"], r["group_seq"]) for r in out] == [("send", 6, 0), ("recv", 6, 0)]
    assert all(r["end_ns"] == 5_000_000 and r["start_ns"] == 4_500_000 for r in out)
    assert set(log.progress) == {("g1", "send", 6), ("g1", "recv", 6)}


def test_a_ring_that_wrapped_between_reads_counts_what_it_overwrote():
    ring = _Ring(size=8)
    reader, out, _ = _reader(ring)
    stuck = ring.add("nccl:all_reduce", seq=1, state="scheduled")
    assert reader.read() == 0
    for seq in range(2, 22):
        ring.add("nccl:all_reduce", seq=seq)
    assert reader.read() == 8
    assert reader.lost == 12 and reader.lost_open == 1, reader.stats
    assert [r["group_seq"] for r in out] == list(range(13, 21))  # torch's count: no shift
    assert stuck["record_id"] == 0


def test_a_reset_ring_starts_its_ids_again_and_close_emits_what_is_in_flight():
    ring = _Ring()
    reader, out, _ = _reader(ring)
    for seq in range(1, 6):
        ring.add("nccl:all_reduce", seq=seq)
    assert reader.read() == 5
    ring.entries, ring.next_id = [], 0  # torch's reset_all: a new epoch, ids from 0
    ring.add("nccl:broadcast", seq=6)
    ring.add("nccl:all_reduce", seq=7, state="started")
    assert reader.read() == 1 and reader.resets == 1 and out[-1]["op"] == "broadcast"
    assert reader.close() == 1 and out[-1]["end_ns"] == 0 and len(out) == 7


def test_an_unknown_group_and_a_broken_dump_are_counted_never_raised():
    ring = _Ring()
    reader, out, _ = _reader(ring)
    ring.add("nccl:all_reduce", "gone", seq=1)
    ring.add("nccl:all_reduce", seq=1)
    assert reader.read() == 1 and reader.errors == 1
    reader.dump = lambda: b"not a pickle"
    assert reader.read() == 0 and reader.errors == 2 and "UnpicklingError" in reader.last_error


def test_reads_are_spaced_by_their_cost_but_never_past_half_the_ring(monkeypatch):
    from ranksight.trainer_hooks import fr_ring

    ticks = iter(range(0, 10**12, 5_000_000))  # each clock reading 5 ms later
    clock = types.SimpleNamespace(perf_counter_ns=lambda: next(ticks), time_ns=time.time_ns)
    monkeypatch.setattr(fr_ring, "time", clock)
    ring = _Ring(size=8)
    reader, out, _ = _reader(ring)
    reader._size = 8
    ring.add("nccl:all_reduce", seq=1)
    assert reader.maybe_read(100.0) == 1
    assert reader._due == pytest.approx(100.0 + fr_ring.DUTY * 0.015)  # a read of 15 ms
    assert reader.maybe_read(100.1) == 0  # not due yet
    for seq in range(2, 6):
        ring.add("nccl:all_reduce", seq=seq)
    monkeypatch.setattr(fr_ring, "DUTY", 1000)  # 15 s after a read of 15 ms: the ring binds
    assert reader.maybe_read(100.6) == 4  # 4 entries in 0.6 s: the ring fills in 1.2 s
    assert reader._due == pytest.approx(100.6 + 0.5 * 8 / (4 / 0.6))
    assert reader.lost == 0


def test_timeline_gives_the_step_and_phase_an_entry_was_issued_in():
    tl = Timeline()
    tl.step(0, 100)
    tl.phase("forward", 110, 200)
    tl.step(1, 300)
    tl.phase("backward", 310, 400)
    assert tl.at(150, (1, "x")) == (0, "forward")
    assert tl.at(250, (1, "x")) == (0, "")
    assert tl.at(450, (1, "optimizer")) == (1, "optimizer")  # a phase still running
    assert tl.at(50, (0, "")) == (-1, "")


# ---------------------------------------------------------------------- real gloo


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, port: int, spool: str, ring_size: int, q) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    os.environ["TORCH_FR_BUFFER_SIZE"] = str(ring_size)
    import torch.distributed as dist

    from ranksight import trainer_hooks

    dist.init_process_group("gloo", rank=rank, world_size=2)
    sub = dist.new_group([0, 1])
    hooks = trainer_hooks.attach(spool_dir=spool, run_id="fr-ring", flush_interval_s=60.0)
    got: list[dict] = []
    log = CollectiveLog(got.append, hooks._context, BlockedClock())
    reader = FrRing(log, got.append, torch._C._distributed_c10d._dump_fr_trace,
                    context=hooks._context, wait_for_completion=False)  # fmt: skip
    hooks._ring = reader  # the hooks feed its timeline (the wrappers still record: no native)
    x, y = torch.ones(16), torch.ones(3, 5, dtype=torch.float64)
    out = [torch.empty(16) for _ in range(2)]
    for step in range(30):
        with hooks.step(step), hooks.phase("backward"):
            dist.all_reduce(x)
            dist.all_reduce(y, group=sub, async_op=True).wait()
            dist.all_gather(out, x)
            dist.broadcast(x, 0)
        if step == 4:  # 20 ops since attach, in a ring of ring_size: read late once
            reader.read()
        elif step > 4:
            reader.read()
    reader.close()
    hooks.close()
    q.put((rank, got, reader.stats, reader.lost + reader.emitted))
    dist.destroy_process_group()


def _run(tmp_path, ring_size: int) -> dict[int, tuple]:
    ctx = mp.get_context("spawn")
    q, port = ctx.Queue(), _free_port()
    procs = [ctx.Process(target=_worker, args=(r, port, str(tmp_path), ring_size, q))
             for r in range(2)]  # fmt: skip
    for p in procs:
        p.start()
    res = {}
    for _ in procs:
        rank, got, stats, total = q.get(timeout=120)
        res[rank] = (got, stats, total)
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    return res


@pytest.mark.skipif(not hasattr(torch._C._distributed_c10d, "_dump_fr_trace"),
                    reason="this torch has no gloo Flight Recorder ring")  # fmt: skip
def test_the_ring_gives_the_wrappers_rows_on_a_real_gloo_job(tmp_path):
    res = _run(tmp_path, ring_size=2000)
    rows = read_spool(str(tmp_path))["collectives"]
    for rank, (got, stats, _total) in res.items():
        assert stats["lost"] == 0 and stats["errors"] == 0, stats
        mine = rows[rows["rank"] == rank].sort_values("enqueue_ns")
        assert len(got) == len(mine) == 120
        wrapped = [tuple(r[k] for k in KEYS) for _, r in mine[list(KEYS)].iterrows()]
        assert [tuple(r[k] for k in KEYS) for r in got] == wrapped
        assert [(r["step"], r["phase"]) for r in got] == list(
            zip(mine["step"], mine["phase"], strict=True)
        )


@pytest.mark.skipif(not hasattr(torch._C._distributed_c10d, "_dump_fr_trace"),
                    reason="this torch has no gloo Flight Recorder ring")  # fmt: skip
def test_a_wrapped_gloo_ring_counts_exactly_the_overwritten_entries(tmp_path):
    res = _run(tmp_path, ring_size=16)
    for got, stats, total in res.values():
        assert stats["lost"] == 20 - 16, stats  # 20 ops at the late read, 16 kept
        assert total == 120 and len(got) == 116
        assert [r["group_seq"] for r in got if r["group_id"] == got[-1]["group_id"]][-1] >= 0
