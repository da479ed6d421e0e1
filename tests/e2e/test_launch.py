"""``ranksight launch -- torchrun ...`` for real: a plain DDP script that never imports
ranksight (the hooks attach from outside), the node agent started or reused, and the
run's status right when the job finishes, fails or is killed; two wrappers as the two
nodes of one torchrun job."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from ranksight.ground import env
from ranksight.launcher import LaunchConfig, job_environment, node_rank, resolve_run_id
from ranksight.store import open_store
from ranksight.store.server import free_port
from ranksight.trainer_hooks.autoattach import AUTOLOAD_DIR, mesh_of, parse_mesh

WORKER = os.path.join(os.path.dirname(os.path.dirname(__file__)), "workers", "zero_code_job.py")
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]


def _torchrun(*args: str) -> list[str]:
    return [*TORCHRUN, "--nproc-per-node=2", *args]


def _launch(tmp_path, store: str, cmd: list[str], *opts: str, spool: str = "spool", **kw):
    env_ = {**os.environ, env.HOME: str(tmp_path / "home"), "OMP_NUM_THREADS": "1"}
    env_.pop(env.RUN_ID, None)
    args = [sys.executable, "-m", "ranksight.cli", "launch", "--store", store,
            "--spool", str(tmp_path / spool), *opts, "--", *cmd]  # fmt: skip
    return subprocess.Popen(args, env=env_, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, **kw)  # fmt: skip


def _status(store_url: str, run_id: str) -> str:
    with open_store(store_url) as store:
        got = store.query(
            "SELECT argMax(status, updated_ns) AS s FROM runs WHERE run_id = %(r)s", {"r": run_id}
        )
    return str(got["s"].iloc[0])


def _run_id(output: str) -> str:
    return output.split("ranksight launch: run ", 1)[1].split()[0]


# ------------------------------------------------------------------ unit
def test_run_id_from_flag_env_or_rendezvous_and_multinode_needs_one(monkeypatch):
    monkeypatch.delenv(env.RUN_ID, raising=False)
    cmd = ("torchrun", "--nnodes=2", "--rdzv-id", "job42", "train.py")
    assert resolve_run_id(LaunchConfig(command=cmd)) == "run-job42"
    assert resolve_run_id(LaunchConfig(command=cmd, run_id="mine")) == "mine"
    monkeypatch.setenv(env.RUN_ID, "from-env")
    assert resolve_run_id(LaunchConfig(command=cmd)) == "from-env"
    monkeypatch.delenv(env.RUN_ID)
    with pytest.raises(ValueError, match="--nnodes 2: every node must record under one run id"):
        resolve_run_id(LaunchConfig(command=("torchrun", "--nnodes", "2", "train.py")))
    assert resolve_run_id(LaunchConfig(command=("torchrun", "--nnodes=1:1", "t.py"))).startswith(
        "run-"
    )
    assert node_rank(("torchrun", "--node_rank=3", "t.py")) == 3


def test_bad_launch_options_are_named():
    with pytest.raises(ValueError, match="no command to launch"):
        LaunchConfig(command=())
    with pytest.raises(ValueError, match="--level 'loud'"):
        LaunchConfig(command=("x",), level="loud")
    with pytest.raises(ValueError, match="--run-id 'a/b'"):
        LaunchConfig(command=("x",), run_id="a/b")
    with pytest.raises(ValueError, match="--mesh 'dp=2,zz=2'"):
        LaunchConfig(command=("x",), mesh="dp=2,zz=2")


def test_job_environment_opts_in_to_zero_code_attach(monkeypatch, tmp_path):
    monkeypatch.setenv("PYTHONPATH", "/somewhere")
    cfg = LaunchConfig(command=("x",), mesh="dp=2,tp=2")
    got = job_environment(cfg, "r1", str(tmp_path), "clickhouse://h:9000/db")
    assert got["PYTHONPATH"] == AUTOLOAD_DIR + os.pathsep + "/somewhere"
    assert os.path.isfile(os.path.join(AUTOLOAD_DIR, "sitecustomize.py"))
    assert (got[env.AUTO_ATTACH], got[env.RUN_ID], got[env.MESH]) == ("1", "r1", "dp=2,tp=2")
    assert got[env.STORE] == "clickhouse://h:9000/db" and got[env.SPOOL_DIR] == str(tmp_path)
    off = job_environment(LaunchConfig(command=("x",), auto_attach=False), "r1", "s", "u")
    assert env.AUTO_ATTACH not in off and off["PYTHONPATH"] == "/somewhere"


def test_mesh_coordinates_follow_the_reference_layout():
    assert parse_mesh("dp=2,pp=2,tp=2") == {"dp": 2, "pp": 2, "tp": 2}
    assert mesh_of(5, 8, "dp=2,pp=2,tp=2")[0] == {"dp": 1, "pp": 0, "tp": 1}
    assert mesh_of(3, 4, None) == ({"dp": 3, "tp": 0, "pp": 0}, {"dp": 4, "tp": 1, "pp": 1})
    with pytest.raises(ValueError, match="has 4 ranks, the job 8"):
        mesh_of(0, 8, "dp=2,tp=2")


# ------------------------------------------------------------------ real jobs
@pytest.mark.training
def test_zero_code_job_is_recorded_and_finished(tmp_path):
    store = str(tmp_path / "store")
    proc = _launch(tmp_path, store, _torchrun("--standalone", WORKER, "4", "ok"))
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out[-3000:]
    assert "a new agent" in out
    run_id = _run_id(out)
    with open_store(store) as s:
        steps = s.query(
            "SELECT rank, count() AS n FROM steps WHERE run_id = %(r)s GROUP BY rank ORDER BY rank",
            {"r": run_id},
        )
        coll = s.query(
            "SELECT count() AS n FROM collectives WHERE run_id = %(r)s AND op = 'all_reduce'",
            {"r": run_id},
        )
        phases = s.query(
            "SELECT phase, step, count() AS n, min(end_ns - start_ns) AS shortest "
            "FROM phases WHERE run_id = %(r)s GROUP BY phase, step ORDER BY phase, step",
            {"r": run_id},
        )
        ranks = s.query(
            "SELECT rank, dp FROM ranks WHERE run_id = %(r)s ORDER BY rank", {"r": run_id}
        )
    # 4 optimizer steps close steps 0..3 (a 5th, open when the job ends, is not recorded)
    assert steps["n"].tolist() == [4, 4], steps
    # 2 ranks x 4 steps x (4 parameters the script all-reduces + DDP's 1 gradient bucket)
    assert int(coll["n"].iloc[0]) == 2 * 4 * (4 + 1)
    # phases found from outside: DataLoader next(), the forward before each backward,
    # autograd backward, the optimizer step; one of each per rank and step
    phases = phases[phases["phase"] != "gc"]  # Python GC pauses, when they happen
    per = phases[phases["step"] <= 3].pivot(index="step", columns="phase", values="n")
    assert sorted(per.columns) == ["backward", "data_wait", "forward", "optimizer"], phases
    assert (per == 2).all().all(), per
    assert (phases["shortest"] > 0).all(), phases
    assert ranks["dp"].tolist() == [0, 1]
    assert _status(store, run_id) == "finished"


@pytest.mark.training
@pytest.mark.clickhouse
def test_failed_job_reusing_a_running_agent(tmp_path, clickhouse_db_url):
    spool = tmp_path / "spool"
    spool.mkdir()
    agent = subprocess.Popen(
        [sys.executable, "-m", "ranksight.cli", "agent", "--spool", str(spool), "--store",
         clickhouse_db_url, "--interval", "0.2", "--collectors", "none"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not list(spool.glob(".agent-*/lock")) and time.monotonic() < deadline:
            time.sleep(0.2)
        proc = _launch(tmp_path, clickhouse_db_url, _torchrun("--standalone", WORKER, "6", "fail"))
        out, _ = proc.communicate(timeout=300)
        assert proc.returncode != 0, out[-3000:]
        assert "the node's agent" in out and "a new agent" not in out
        run_id = _run_id(out)
        assert _status(clickhouse_db_url, run_id) == "failed"
        assert "ranksight launch: rank 1 failed first (exit code 1)" in out
        assert "injected failure at step 2" in out  # the job's stderr still reaches ours
        with open_store(clickhouse_db_url) as s:
            ends = s.query(
                "SELECT rank, code, detail FROM rank_ends WHERE run_id = %(r)s "
                "AND source = 'launcher' ORDER BY rank",
                {"r": run_id},
            )
        root = ends[ends["detail"].str.startswith("root cause")]
        assert list(root["rank"]) == [1] and list(root["code"]) == [1]
        deadline = time.monotonic() + 30  # the running agent ships the job's records
        while time.monotonic() < deadline:
            with open_store(clickhouse_db_url) as s:
                n = int(
                    s.query("SELECT count() AS n FROM steps WHERE run_id = %(r)s", {"r": run_id})[
                        "n"
                    ].iloc[0]
                )
            if n >= 2:
                break
            time.sleep(0.5)
        assert n >= 2
    finally:
        agent.send_signal(signal.SIGTERM)
        agent.wait(60)


@pytest.mark.training
@pytest.mark.clickhouse
def test_killed_wrapper_stops_the_job_and_records_killed(tmp_path, clickhouse_db_url):
    with open_store(clickhouse_db_url) as s:
        s.init_schema()
    proc = _launch(tmp_path, clickhouse_db_url, _torchrun("--standalone", WORKER, "300", "slow"),
                   "--grace-s", "20")  # fmt: skip
    deadline, run_id = time.monotonic() + 120, None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if "ranksight launch: run " in line:
            run_id = _run_id(line)
            break
    assert run_id
    while time.monotonic() < deadline:
        with open_store(clickhouse_db_url) as s:
            got = s.query("SELECT count() AS n FROM steps WHERE run_id = %(r)s", {"r": run_id})
        if int(got["n"].iloc[0]) >= 2:
            break
        time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, out[-3000:]
    assert _status(clickhouse_db_url, run_id) == "killed"
    assert f"run {run_id} killed" in out


@pytest.mark.training
@pytest.mark.clickhouse
def test_two_nodes_each_running_the_wrapper_record_one_run(tmp_path, clickhouse_db_url):
    port = free_port()
    procs = [
        _launch(
            tmp_path, clickhouse_db_url,
            _torchrun("--nnodes=2", f"--node-rank={n}", "--rdzv-backend=c10d",
                      f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=twonode", WORKER, "3", "ok"),
            spool=f"spool-node{n}",
        )
        for n in (0, 1)
    ]  # fmt: skip
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs[0][-2000:] + outs[1][-2000:]
    assert all("run run-twonode node" in o for o in outs)
    with open_store(clickhouse_db_url) as s:
        ranks = s.query(
            "SELECT rank, count() AS n FROM steps WHERE run_id = 'run-twonode' GROUP BY rank ORDER BY rank"
        )
        world = s.query("SELECT max(world_size) AS w FROM runs WHERE run_id = 'run-twonode'")
    assert ranks["rank"].tolist() == [0, 1, 2, 3] and set(ranks["n"]) == {3}
    assert int(world["w"].iloc[0]) == 4
    assert _status(clickhouse_db_url, "run-twonode") == "finished"
