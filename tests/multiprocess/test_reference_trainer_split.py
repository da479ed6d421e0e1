"""The reference trainer's uneven layer split (``--layer-split``): its rules, the blocks
each stage holds, and a real 2-stage gloo run that trains the same model as one process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ranksight.reference_trainer.config import ModelConfig, ParallelConfig, TrainConfig
from ranksight.reference_trainer.model import build_stage, stage_layers
from ranksight.reference_trainer.train import build_parser, config_from_args


@pytest.mark.parametrize(
    ("split", "message"),
    [
        ((3,), "has 1 entries, want one per pipeline stage \\(pp = 2\\)"),
        ((4, 0), "every stage needs at least one block"),
        ((2, 1), "sums to 3 blocks, want model.layers \\(4\\)"),
    ],
)
def test_layer_split_rules_name_the_option(split, message):
    with pytest.raises(ValueError, match="--layer-split") as err:
        TrainConfig(parallel=ParallelConfig(pp=2, layer_split=split), model=ModelConfig(layers=4))
    assert err.match(message)


def test_layer_split_flag_parses_and_rejects_garbage(capsys):
    cfg = config_from_args(["--pp", "2", "--layers", "4", "--layer-split", "3,1"])
    assert cfg.parallel.layer_split == (3, 1)
    assert cfg.to_record()["parallel"]["layer_split"] == (3, 1)
    assert config_from_args(["--pp", "2"]).parallel.layer_split is None
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--layer-split", "3,x"])
    assert "argument --layer-split: '3,x' is not a comma-separated list" in capsys.readouterr().err
    with pytest.raises(ValueError, match="--layer-split"):
        config_from_args(["--pp", "2", "--layers", "4", "--layer-split", "2,1"])


def test_stage_layers_follow_the_split():
    assert [stage_layers(4, 2, s, (3, 1)) for s in range(2)] == [range(0, 3), range(3, 4)]
    assert [stage_layers(6, 3, s, [1, 4, 1]) for s in range(3)] == [
        range(0, 1), range(1, 5), range(5, 6),
    ]  # fmt: skip
    with pytest.raises(ValueError, match="must have 2 entries, each >= 1, summing to 4"):
        stage_layers(4, 2, 0, (2, 1))


def test_uneven_split_builds_the_same_model():
    cfg = ModelConfig(d_model=64, layers=4, heads=4, seq_len=16)
    tokens = torch.randint(0, 256, (2, 16))
    whole = build_stage(cfg, 1, 0, seed=3)(tokens)
    first, last = (build_stage(cfg, 2, s, seed=3, split=(3, 1)) for s in range(2))
    assert sorted(first.blocks) == ["0", "1", "2"] and list(last.blocks) == ["3"]
    torch.testing.assert_close(last(first(tokens)), whole)


def _run(tmp: Path, name: str, nproc: int, *flags: str) -> tuple[dict, str]:
    summary = tmp / f"{name}.json"
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        "--nproc-per-node", str(nproc), "-m", "ranksight.reference_trainer.train",
        "--hooks", "off", "--steps", "5", "--warmup", "2", "--summary", str(summary), *flags,
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(summary.read_text()), proc.stdout


@pytest.mark.training
def test_uneven_split_trains_like_one_process(tmp_path):
    split, log = _run(tmp_path, "split", 2, "--pp", "2", "--layer-split", "3,1")
    single, _ = _run(tmp_path, "single", 1)
    assert "blocks per stage [3, 1]" in log
    assert split["config"]["parallel"]["layer_split"] == [3, 1]
    losses = [s["loss"] for s in split["steps"]]
    assert losses == pytest.approx([s["loss"] for s in single["steps"]], abs=2e-3)
    assert losses[-1] < losses[0]


@pytest.mark.training
def test_bad_split_stops_the_launch_with_the_option_named(tmp_path):
    cmd = [sys.executable, "-m", "ranksight.reference_trainer.train", "--pp", "2",
           "--layers", "4", "--layer-split", "1,1,2"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "--layer-split) 1,1,2 has 3 entries" in proc.stderr
