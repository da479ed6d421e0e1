"""The hooks' Flight Recorder dump on request reads both of torch's rings: NCCL's
(``_dump_nccl_trace``) and the other backends' (``_dump_fr_trace``). On an NCCL job the
second is empty (recorded on 2 H200s, torch 2.11: the dump the hooks wrote held no entry
while NCCL's ring had the hung all_reduce)."""

from __future__ import annotations

import pickle

import pytest
import torch

from ranksight.trainer_hooks.flight_recorder import dump_bytes

EMPTY = {"version": "2.10", "pg_config": {}, "comm_lib_version": "", "pg_status": {}, "entries": []}


def _ring(pg: str, *created: int) -> dict:
    entries = [{"record_id": i, "pg_id": 0, "process_group": (pg, ""), "profiling_name": f"{pg}:all_reduce",
                "collective_seq_id": i + 1, "time_created_ns": t, "state": "scheduled"}
               for i, t in enumerate(created)]  # fmt: skip
    return {**EMPTY, "pg_config": {pg: {"desc": pg, "ranks": "[0, 1]"}},
            "pg_status": {pg: {"last_enqueued_collective": len(created)}}, "entries": entries}  # fmt: skip


@pytest.fixture
def c10d(monkeypatch):
    mod = torch._C._distributed_c10d
    monkeypatch.delattr(mod, "_dump_nccl_trace", raising=False)
    monkeypatch.delattr(mod, "_dump_fr_trace", raising=False)

    def set_rings(nccl=None, other=None):
        if nccl is not None:
            monkeypatch.setattr(mod, "_dump_nccl_trace", nccl, raising=False)
        if other is not None:
            monkeypatch.setattr(mod, "_dump_fr_trace", other, raising=False)

    return set_rings


def test_the_nccl_ring_is_taken_when_the_other_is_empty(c10d):
    nccl = _ring("0", 5, 9)
    c10d(nccl=lambda: pickle.dumps(nccl), other=lambda: pickle.dumps(EMPTY))
    assert pickle.loads(dump_bytes()) == nccl


def test_two_rings_with_entries_are_merged_in_time_order(c10d):
    c10d(nccl=lambda: pickle.dumps(_ring("0", 5, 9)), other=lambda: pickle.dumps(_ring("1", 7)))
    got = pickle.loads(dump_bytes())
    assert [e["time_created_ns"] for e in got["entries"]] == [5, 7, 9]
    assert set(got["pg_config"]) == {"0", "1"} and set(got["pg_status"]) == {"0", "1"}
    assert got["version"] == "2.10"


def test_odd_layouts_never_lose_the_dump(c10d):
    """A group name in both rings keeps both; an entry without a time sorts first; a
    layout the merge does not know gives NCCL's ring as it is."""
    other = _ring("0", 7)
    other["entries"][0]["time_created_ns"] = None
    c10d(nccl=lambda: pickle.dumps(_ring("0", 5)), other=lambda: pickle.dumps(other))
    got = pickle.loads(dump_bytes())
    assert [e["time_created_ns"] for e in got["entries"]] == [None, 5]
    assert set(got["pg_config"]) == {"0", "0:1"}
    nccl = _ring("0", 5)
    c10d(nccl=lambda: pickle.dumps(nccl), other=lambda: pickle.dumps(["not", "a", "dump"]))
    assert pickle.loads(dump_bytes()) == nccl


def test_a_ring_that_fails_leaves_the_other(c10d):
    def broken():
        raise RuntimeError("NCCL is not available in this process")

    other = _ring("1", 3)
    c10d(nccl=broken, other=lambda: pickle.dumps(other))
    assert pickle.loads(dump_bytes()) == other
    c10d(other=broken)
    with pytest.raises(RuntimeError, match="_dump_nccl_trace: NCCL is not available"):
        dump_bytes()


def test_no_dump_function_is_a_clear_error(c10d):
    with pytest.raises(RuntimeError, match="no Flight Recorder dump function"):
        dump_bytes()
