"""Tests of the reference trainer: pure unit tests, then real torchrun launches on gloo."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from ranksight.ground.mesh import coords_of, rank_of
from ranksight.reference_trainer._hooks_seam import NoopHooks, attach_hooks
from ranksight.reference_trainer.config import (
    ModelConfig,
    OptimConfig,
    ParallelConfig,
    TrainConfig,
)
from ranksight.reference_trainer.data import ByteWindowSampler, corpus_bytes
from ranksight.reference_trainer.faults import (
    FaultSpec,
    faults_ground_truth,
    parse_fault,
    parse_faults,
)
from ranksight.reference_trainer.inject import StepClock, install_faults
from ranksight.reference_trainer.model import build_stage, count_params, stage_layers
from ranksight.reference_trainer.optim import lr_at
from ranksight.reference_trainer.train import config_from_args

SHAPE = {"dp": 2, "tp": 2, "pp": 2}

# ---------------------------------------------------------------- config validation


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: ParallelConfig(dp=2, tp=2, pp=2, world_size=4), "world size 4 != dp\\*tp\\*pp"),
        (lambda: ParallelConfig(dp=0), "parallel.dp must be >= 1"),
        (lambda: ParallelConfig(pp=4, microbatches=2), "microbatches \\(2\\) must be >= pp"),
        (lambda: ParallelConfig(dp_mode="ddp"), "dp_mode"),
        (lambda: ModelConfig(d_model=250, heads=4), "divisible by model.heads"),
        (lambda: ModelConfig(layers=0), "model.layers must be >= 1"),
        (lambda: OptimConfig(lr=0), "optim.lr must be > 0"),
        (lambda: OptimConfig(min_lr_ratio=2), "min_lr_ratio"),
        (
            lambda: TrainConfig(parallel=ParallelConfig(tp=3)),
            "heads \\(4\\) must be divisible by tp",
        ),
        (
            lambda: TrainConfig(parallel=ParallelConfig(pp=4), model=ModelConfig(layers=2)),
            "layers \\(2\\) must be >= pp \\(4\\)",
        ),
        (lambda: TrainConfig(batch_size=6), "batch_size \\(6\\) must be divisible"),
        (lambda: TrainConfig(device="tpu"), "device must be one of"),
        (lambda: TrainConfig(dtype="fp16"), "dtype must be one of"),
        (lambda: TrainConfig(hooks="verbose"), "hooks must be one of"),
        (
            lambda: TrainConfig(faults=(parse_fault("slow:rank=8,factor=2"),)),
            "targets rank 8 but world size is 1",
        ),
    ],
)
def test_config_rules_raise_value_error(build, message):
    with pytest.raises(ValueError, match=message):
        build()


def test_config_defaults_are_valid_and_serialisable():
    cfg = TrainConfig(faults=parse_faults(["slow:rank=0,factor=2"]))
    record = cfg.to_record()
    assert record["faults"] == ["slow:rank=0,factor=2.0,from_step=0"]
    assert json.loads(json.dumps(record))["parallel"]["dp"] == 1


def test_cli_checks_world_size_from_torchrun(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "8")
    cfg = config_from_args(["--dp", "2", "--tp", "2", "--pp", "2", "--inject", "none"])
    assert (cfg.parallel.world_size, cfg.faults) == (8, ())
    with pytest.raises(ValueError, match="world size 8 != dp"):
        config_from_args(["--dp", "2"])


# ---------------------------------------------------------------- fault specs


def test_parse_slow_fault_and_round_trip():
    spec = parse_fault("slow:rank=3,factor=4,from_step=5")
    assert spec == FaultSpec(kind="slow", rank=3, factor=4.0, from_step=5)
    assert parse_fault(spec.text) == spec
    assert [spec.active_at(s) for s in (4, 5, 100)] == [False, True, True]
    bounded = parse_fault("slow: rank=1, factor=1.5, from_step=2, until_step=3")
    assert [bounded.active_at(s) for s in (1, 2, 3, 4)] == [False, True, True, False]
    assert parse_fault("slow:rank=0,factor=2").active_at(0)


def test_none_is_a_clean_run():
    assert parse_faults(["none", "NONE"]) == ()


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("explode:rank=1", "unknown kind 'explode'"),
        ("slow:rank=1", "missing factor"),
        ("slow:factor=2", "missing rank"),
        ("slow:rank=one,factor=2", "rank='one' is not int"),
        ("slow:rank=1,factor=2,speed=3", "unknown key 'speed'"),
        ("slow:rank=1,factor=2,rank=2", "key 'rank' given twice"),
        ("slow:rank=1,factor", "expected key=value"),
        ("slow:rank=1,factor=0.5", "factor must be >= 1"),
        ("slow:rank=-1,factor=2", "rank must be >= 0"),
        ("slow:rank=1,factor=2,from_step=-1", "from_step must be >= 0"),
        ("slow:rank=1,factor=2,from_step=5,until_step=4", "until_step \\(4\\) < from_step"),
        ("none:rank=1", "none does not take rank"),
    ],
)
def test_fault_parse_errors_name_spec_and_problem(text, problem):
    with pytest.raises(ValueError, match=problem) as info:
        parse_fault(text)
    assert repr(text) in str(info.value)


def test_ground_truth_records_rank_and_mesh_coordinates():
    specs = parse_faults(["slow:rank=3,factor=4,from_step=5", "none"])
    assert faults_ground_truth(specs, SHAPE) == [
        {
            "kind": "slow",
            "rank": 3,
            "factor": 4.0,
            "from_step": 5,
            "until_step": None,
            "spec": "slow:rank=3,factor=4.0,from_step=5",
            "dp": 0,
            "tp": 1,
            "pp": 1,
        }
    ]
    assert "dp" not in faults_ground_truth(specs)[0]


# ---------------------------------------------------------------- layout, model, data, lr


def test_rank_layout_is_dp_pp_tp_outermost_first():
    assert [tuple(coords_of(r, SHAPE).values()) for r in range(8)] == [
        (0, 0, 0), (0, 1, 0), (0, 0, 1), (0, 1, 1),
        (1, 0, 0), (1, 1, 0), (1, 0, 1), (1, 1, 1),
    ]  # fmt: skip
    shape = {"dp": 3, "tp": 2, "pp": 4}
    assert all(rank_of(coords_of(r, shape), shape) == r for r in range(24))
    with pytest.raises(ValueError, match="outside a mesh of 8"):
        coords_of(8, SHAPE)


def test_stage_layers_split_evenly():
    assert [stage_layers(7, 3, s) for s in range(3)] == [range(0, 3), range(3, 5), range(5, 7)]
    with pytest.raises(ValueError, match="cannot split 2 layers over 4"):
        stage_layers(2, 4, 0)


def test_pipeline_split_builds_the_same_model():
    cfg = ModelConfig(d_model=64, layers=3, heads=4, seq_len=16)
    tokens = torch.randint(0, 256, (2, 16))
    whole = build_stage(cfg, 1, 0, seed=7)(tokens)
    stages = [build_stage(cfg, 3, s, seed=7) for s in range(3)]
    hidden = tokens
    for stage in stages:
        hidden = stage(hidden)
    assert whole.shape == (2, 16, 256)
    torch.testing.assert_close(hidden, whole)
    assert count_params(cfg) == sum(p.numel() for s in stages for p in s.parameters())


def test_sampler_is_deterministic_per_dp_rank():
    def batch(dp, step):
        return ByteWindowSampler(seq_len=32, batch_size=4, dp_rank=dp, seed=0).batch(step)

    a, b = batch(0, 1), batch(0, 1)
    assert torch.equal(a.inputs, b.inputs) and a.inputs.shape == (4, 32)
    assert not torch.equal(a.inputs, batch(1, 1).inputs)
    assert not torch.equal(a.inputs, batch(0, 2).inputs)
    assert torch.equal(a.inputs[:, 1:], a.targets[:, :-1]) and a.tokens == 128
    assert len(corpus_bytes()) > 400_000


def test_lr_warms_up_then_decays():
    cfg = OptimConfig(lr=1e-3, warmup_steps=4, min_lr_ratio=0.1)
    assert lr_at(0, cfg, 20) == pytest.approx(2.5e-4)
    assert lr_at(3, cfg, 20) == pytest.approx(1e-3)
    assert lr_at(19, cfg, 20) == pytest.approx(1e-4)
    assert lr_at(10, cfg, 20) < lr_at(5, cfg, 20)


# ---------------------------------------------------------------- fault injection, hooks seam


class _FakeStage:
    def forward_one_chunk(self, fwd_chunk_id, args, kwargs=None, save_forward_output=True):
        time.sleep(0.05)
        return fwd_chunk_id

    def backward_one_chunk(self, bwd_chunk_id, loss=None, full_backward=True, last_backward=False):
        time.sleep(0.05)


def _timed(fn, *args):
    start = time.perf_counter()
    fn(*args)
    return time.perf_counter() - start


def test_slow_fault_stretches_compute_inside_the_hooks_timing():
    stage, clock = _FakeStage(), StepClock(step=1)
    specs = parse_faults(["slow:rank=2,factor=3,from_step=2"])
    assert install_faults(stage, specs, rank=1, clock=clock, device=torch.device("cpu")) == []
    (slow,) = install_faults(stage, specs, rank=2, clock=clock, device=torch.device("cpu"))
    # Hooks instrument after the fault is installed, so their wrapper sees the delay.
    hooked = _FakeStage()
    hooked.forward_one_chunk = stage.forward_one_chunk
    assert _timed(hooked.forward_one_chunk, 0, ()) < 0.1
    clock.step = 2
    assert _timed(hooked.forward_one_chunk, 0, ()) >= 0.14
    assert _timed(stage.backward_one_chunk, 0) >= 0.14
    assert slow.injected_s >= 0.19


def test_noop_hooks_have_the_hooks_surface():
    hooks = attach_hooks(level="off", run_id=None, mesh={}, mesh_shape={}, meta={})
    assert isinstance(hooks, NoopHooks)
    stage = _FakeStage()
    assert hooks.instrument_pipeline_stage(stage) is stage
    with hooks.step(1) as record:
        with hooks.phase("data_wait"):
            pass
        record.set(loss=None, tokens=128, lr=1e-3)
    hooks.close()


# ---------------------------------------------------------------- real torchrun launches


def _torchrun(tmp: Path, name: str, nproc: int, *flags: str) -> dict:
    summary = tmp / f"{name}.json"
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        "--nproc-per-node", str(nproc), "-m", "ranksight.reference_trainer.train",
        "--hooks", "off", "--summary", str(summary), *flags,
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "step    0 loss" in proc.stdout
    return json.loads(summary.read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, dict]:
    tmp = tmp_path_factory.mktemp("reference_trainer")
    launches = {
        "3d": (8, "--dp 2 --tp 2 --pp 2 --steps 8"),
        "single": (1, "--steps 6 --warmup 2"),
        "slow": (4, "--tp 2 --pp 2 --steps 6 --warmup 2 --inject slow:rank=1,factor=4,from_step=3"),
    }
    return {name: _torchrun(tmp, name, n, *flags.split()) for name, (n, flags) in launches.items()}


@pytest.mark.training
def test_3d_parallel_run_on_8_gloo_ranks_learns(runs):
    summary = runs["3d"]
    losses = [s["loss"] for s in summary["steps"]]
    assert summary["world_size"] == 8 and summary["faults"] == []
    assert len(losses) == 8 and losses[-1] < losses[0] - 0.5, losses
    assert sorted(summary["step_seconds_by_rank"]) == [str(r) for r in range(8)]


@pytest.mark.training
def test_tp_pp_split_matches_single_process_losses(runs):
    split = [s["loss"] for s in runs["slow"]["steps"]]
    single = [s["loss"] for s in runs["single"]["steps"]]
    assert split == pytest.approx(single, abs=2e-3)


@pytest.mark.training
def test_slow_rank_slows_every_rank_and_is_recorded(runs):
    summary = runs["slow"]
    (fault,) = summary["faults"]
    assert (fault["kind"], fault["rank"], fault["tp"], fault["pp"]) == ("slow", 1, 1, 0)
    injected = summary["injected_seconds_by_rank"]
    assert injected["1"] > 0 and all(injected[r] == 0 for r in ("0", "2", "3"))
    for rank, seconds in summary["step_seconds_by_rank"].items():
        before, after = statistics.median(seconds[1:3]), statistics.median(seconds[3:])
        assert after > 1.3 * before, (rank, seconds)
