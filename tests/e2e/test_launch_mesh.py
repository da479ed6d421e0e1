"""``ranksight launch`` keeps the mesh the trainer builds: DeviceMesh dimension names mapped
to dp/tp/pp, the identity records held back until the trainer's mesh is known, and real
launches (the reference trainer with its own attach, a plain script calling
``init_device_mesh``) whose stored coordinates are the trainer's."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from ranksight.ground import env
from ranksight.ground.mesh import coords_of
from ranksight.store import open_store
from ranksight.trainer_hooks import rank_mesh
from ranksight.trainer_hooks.rank_mesh import RankIdentity, axis_of, mesh_coordinates

WORKER = os.path.join(os.path.dirname(os.path.dirname(__file__)), "workers", "device_mesh_job.py")


class _Mesh:
    """The part of torch's DeviceMesh that ``mesh_coordinates`` reads, for one rank."""

    def __init__(self, sizes, names, rank):
        self.mesh = torch.arange(int(torch.tensor(sizes).prod())).reshape(sizes)
        self.mesh_dim_names = names
        where = (self.mesh == rank).nonzero()
        self._coord = [int(i) for i in where[0]] if len(where) else None

    def get_coordinate(self):
        return self._coord


def test_dimension_names_map_to_dp_tp_pp():
    assert [axis_of(n) for n in ("dp", "dp_shard", "cp", "ep", None, "pp", "pipe", "tp")] == [
        "dp", "dp", "dp", "dp", "dp", "pp", "pp", "tp",
    ]  # fmt: skip
    # the reference trainer's ("dp", "pp", "tp") gives ranksight.ground.mesh's layout
    shape = {"dp": 2, "tp": 2, "pp": 2}
    for r in range(8):
        got = mesh_coordinates(_Mesh((2, 2, 2), ("dp", "pp", "tp"), r), 8)
        assert got == (coords_of(r, shape), shape)
    # torchtitan's HSDP: dp_replicate x dp_shard fold into one dp axis, row-major
    got = mesh_coordinates(_Mesh((2, 3, 2), ("dp_replicate", "dp_shard", "tp"), 9), 12)
    assert got == ({"dp": 4, "tp": 1, "pp": 0}, {"dp": 6, "tp": 2, "pp": 1})
    assert mesh_coordinates(_Mesh((2,), ("tp",), 1), 8) is None  # a sub-mesh
    assert mesh_coordinates(_Mesh((4,), None, 3), 4) == (
        {"dp": 3, "tp": 0, "pp": 0}, {"dp": 4, "tp": 1, "pp": 1},
    )  # fmt: skip


def _identity(final: bool):
    out: list[dict] = []
    run = {"t": "runs", "dp": 4, "tp": 1, "pp": 1, "meta_json": "{}"}
    ident = RankIdentity(
        out.append,
        lambda status: out.append({**run, "status": status}),
        {"t": "ranks", "dp": 3, "tp": 0, "pp": 0},
        run,
        final=final,
    )
    return ident, out


def test_a_guess_waits_for_the_trainers_mesh_and_the_trainers_attach_wins(monkeypatch):
    ident, out = _identity(final=False)
    assert ident.pending and out == []
    got = ident.adopt({"dp": 1, "tp": 1, "pp": 0}, {"dp": 2, "tp": 2, "pp": 1}, "init_device_mesh")
    assert got == "settled" and not ident.pending
    assert [(r["t"], r["dp"], r["tp"]) for r in out] == [("ranks", 1, 1), ("runs", 2, 2)]
    assert ident.adopt({"dp": 1, "tp": 1, "pp": 0}, None, "init_device_mesh") == "same"
    assert ident.adopt({"dp": 0, "tp": 1, "pp": 1}, None, "attach", '{"x": 1}') == "rewritten"
    assert (out[-2]["dp"], out[-2]["pp"], out[-1]["meta_json"]) == (0, 1, '{"x": 1}')
    assert ident.adopt({"dp": 3, "tp": 0, "pp": 0}, None, "init_device_mesh") == "ignored"
    with pytest.raises(ValueError, match="mesh source 'nope' is not one of"):
        ident.adopt({}, None, "nope")


def test_a_guess_goes_out_at_its_deadline_and_a_given_mesh_at_once(monkeypatch):
    monkeypatch.setattr(rank_mesh, "MESH_WAIT_S", 0.0)
    ident, out = _identity(final=False)
    ident.settle(only_if_due=True)
    assert [r["t"] for r in out] == ["ranks", "runs"] and not ident.pending
    _, given = _identity(final=True)
    assert [r["t"] for r in given] == ["ranks", "runs"]


def _launch(tmp_path, *cmd: str) -> tuple[str, str]:
    store = str(tmp_path / "store")
    env_ = {**os.environ, env.HOME: str(tmp_path / "home"), "OMP_NUM_THREADS": "1"}
    env_.pop(env.RUN_ID, None)
    args = [sys.executable, "-m", "ranksight.cli", "launch", "--store", store,
            "--spool", str(tmp_path / "spool"), "--", sys.executable, "-m",
            "torch.distributed.run", "--standalone", "--nproc-per-node=4", *cmd]  # fmt: skip
    proc = subprocess.run(args, env=env_, capture_output=True, text=True, timeout=400)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    return store, out.split("ranksight launch: run ", 1)[1].split()[0]


def _stored(store: str, run_id: str):
    with open_store(store) as s:
        ranks = s.query(
            "SELECT rank, dp, tp, pp FROM ranks WHERE run_id = %(r)s ORDER BY rank", {"r": run_id}
        )
        runs = s.query(
            "SELECT dp, tp, pp, meta_json FROM runs WHERE run_id = %(r)s AND dp > 0", {"r": run_id}
        )
    return ranks, runs


@pytest.mark.training
def test_launched_reference_trainer_keeps_its_own_mesh(tmp_path):
    store, run_id = _launch(
        tmp_path, "-m", "ranksight.reference_trainer.train", "--tp", "2", "--pp", "2",
        "--steps", "3", "--warmup", "1",
    )  # fmt: skip
    ranks, runs = _stored(store, run_id)
    shape = {"dp": 1, "tp": 2, "pp": 2}
    # one row per rank, with the trainer's coordinates (the guess was dp = rank)
    assert ranks["rank"].tolist() == [0, 1, 2, 3]
    for row in ranks.itertuples():
        assert {"dp": row.dp, "tp": row.tp, "pp": row.pp} == coords_of(row.rank, shape)
    assert {(r.dp, r.tp, r.pp) for r in runs.itertuples()} == {(1, 2, 2)}
    meta = json.loads(runs["meta_json"].iloc[-1])
    assert meta["mesh_from"] == "attach" and meta["attached"] == "auto"
    assert meta["config"]["parallel"]["tp"] == 2 and meta["faults"] == []


@pytest.mark.training
def test_launched_plain_script_takes_its_device_mesh(tmp_path):
    store, run_id = _launch(tmp_path, WORKER, "3")
    ranks, runs = _stored(store, run_id)
    assert ranks["rank"].tolist() == [0, 1, 2, 3]
    got = [(r.dp, r.tp, r.pp) for r in ranks.itertuples()]
    assert got == [(0, 0, 0), (0, 1, 0), (1, 0, 0), (1, 1, 0)]  # ("dp_shard", "tp")
    assert {(r.dp, r.tp, r.pp) for r in runs.itertuples()} == {(2, 2, 1)}
    assert json.loads(runs["meta_json"].iloc[-1])["mesh_from"] == "init_device_mesh"
