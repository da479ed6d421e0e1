"""The hooks on plain DDP and FSDP2 scripts (not the reference trainer): every gradient
collective is seen at the default level, matching a dispatcher-level count."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys

import pytest

from tests.helpers.spool import read_spool

WORKER = os.path.join(os.path.dirname(os.path.dirname(__file__)), "workers", "plain_job.py")
_OP_NAMES = {"allreduce": "all_reduce", "allgather": "all_gather", "_allgather_base": "all_gather",
             "_reduce_scatter_base": "reduce_scatter", "reduce_scatter_tensor": "reduce_scatter",
             "all_gather_into_tensor": "all_gather"}  # fmt: skip
# DDP's constructor broadcasts the parameters and checks their shapes from C++: only the
# detailed level sees those; its gradient buckets (through instrument_ddp) the default does.
CASES = [
    ("ddp", "default", "all_reduce", False),
    ("ddp", "detailed", "all_reduce", True),
    ("fsdp", "default", "reduce_scatter", True),
]


def run_plain_job(spool: str, *args: str, **env: str) -> None:
    """torchrun 2 ranks of the plain job (``args``: its mode and options) writing to
    ``spool``, with ``env`` added (a value None removes the variable); asserts it exits 0."""
    full = {**os.environ, "RANKSIGHT_SPOOL_DIR": spool, "OMP_NUM_THREADS": "1", **env}
    full = {k: v for k, v in full.items() if v is not None}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           WORKER, *args]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=full)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]


def _by_op(counts: dict[str, int]) -> dict[str, int]:
    out: dict[str, int] = {}
    for name, n in counts.items():
        op = name.split(" ", 1)[1].rsplit(".", 1)[-1].rstrip("_")
        op = _OP_NAMES.get(op, op)
        out[op] = out.get(op, 0) + n
    return out


@pytest.mark.parametrize(("mode", "level", "op", "complete"), CASES)
def test_plain_script_collectives_are_all_seen(tmp_path, mode, level, op, complete):
    spool = str(tmp_path / "spool")
    run_plain_job(spool, mode, RANKSIGHT_RUN_ID=mode, RANKSIGHT_VERIFY_COUNTS="1",
                  RANKSIGHT_LEVEL=level)  # fmt: skip
    paths = glob.glob(os.path.join(spool, mode, "a0", "counts-rank*.json"))
    assert len(paths) == 2
    for path in paths:
        with open(path) as f:
            counts = json.load(f)
        if complete:
            assert counts["hooks"] == counts["dispatch"], counts
        else:
            assert _by_op(counts["hooks_ops"])[op] == _by_op(counts["dispatch_ops"])[op], counts
    frames = read_spool(spool)
    coll = frames["collectives"]
    grads = coll[(coll["op"] == op) & (coll["phase"] == "backward")]
    assert len(grads) >= 2 * 4, coll.groupby(["op", "phase"]).size()  # per rank, every step
    assert set(frames["phases"]["phase"]) >= {"data_wait", "forward", "backward", "optimizer"}
    norms = frames["steps"].pivot(index="step", columns="rank", values="grad_norm")
    if mode == "ddp":  # the heartbeat's gradient norm: of all-reduced gradients, so equal
        assert norms.shape == (4, 2) and (norms > 0).all().all(), norms
        assert (norms[0] - norms[1]).abs().max() < 1e-6 * norms[0].max(), norms
    else:  # the script gives none: recorded as NaN, not as a number
        assert norms.isna().all().all(), norms
    assert (frames["steps"]["gpu_mem_allocated_bytes"].fillna(0) == 0).all()  # CPU ranks


def test_ranks_launched_without_a_run_id_share_rank_0s(tmp_path):
    spool = str(tmp_path / "spool")
    run_plain_job(spool, "ddp", RANKSIGHT_RUN_ID=None)
    runs = os.listdir(spool)
    assert len(runs) == 1 and runs[0].startswith("run-"), runs
    frames = read_spool(spool)
    assert sorted(frames["steps"]["rank"].unique()) == [0, 1]
    assert set(frames["steps"]["run_id"]) == {runs[0]}


def test_ddp_end_of_backward_wait_is_blocked_time_so_the_slow_rank_stands_out(tmp_path):
    """DDP's reducer waits for the buckets in C++ at the end of backward: the hooks must
    still count that as blocked, or the waiting rank's backward looks like slow compute
    as long as the slow rank's forward (and the analysis names no one)."""
    from ranksight.analyzer import analyze
    from ranksight.store import open_store

    spool = str(tmp_path / "spool")
    run_plain_job(spool, "ddp", "slow", RANKSIGHT_RUN_ID="ddp-slow")
    frames = read_spool(spool)
    ph = frames["phases"]
    back = ph[(ph["phase"] == "backward") & (ph["rank"] == 0) & (ph["step"] >= 2)]
    assert len(back) == 10
    assert (back["wait_ns"] >= 0.8 * (back["end_ns"] - back["start_ns"])).all(), back
    assert (back["wait_ns"] > 100e6).all(), back  # it waited out rank 1's 150 ms
    store = open_store(str(tmp_path / "store"))
    store.init_schema()
    for table, frame in frames.items():
        store.insert(table, frame)
    assert [f.culprit_rank for f in analyze(store, "ddp-slow", save=False).findings] == [1]
