"""Entry point: ``torchrun --nproc-per-node N -m ranksight.reference_trainer.train [flags]``.

Example, 8 CPU ranks (DP2 x TP2 x PP2) with rank 3 four times slower from step 5::

    python -m torch.distributed.run --standalone --nproc-per-node 8 \\
        -m ranksight.reference_trainer.train --dp 2 --tp 2 --pp 2 --steps 30 \\
        --inject slow:rank=3,factor=4,from_step=5 --summary /tmp/summary.json

The loss is printed by the rank at (dp=0, tp=0, pp=last). ``--summary`` makes that rank
write a JSON summary: config, fault ground truth, parameter count, per-step loss and
learning rate, and every rank's step times.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ranksight.ground import env
from ranksight.ground.mesh import coords_of
from ranksight.ground.words import counted
from ranksight.reference_trainer._hooks_seam import TrainerHooks, attach_hooks
from ranksight.reference_trainer.config import (
    DEVICES,
    DP_MODES,
    DTYPES,
    HOOK_LEVELS,
    ModelConfig,
    OptimConfig,
    ParallelConfig,
    TrainConfig,
)
from ranksight.reference_trainer.data import ByteWindowSampler
from ranksight.reference_trainer.fault_runtime import FaultRuntime
from ranksight.reference_trainer.faults import faults_ground_truth, parse_faults
from ranksight.reference_trainer.flops import flops_meta
from ranksight.reference_trainer.inject import StepClock
from ranksight.reference_trainer.model import count_params, stage_layers
from ranksight.reference_trainer.optim import build_optimizer, lr_at, set_lr
from ranksight.reference_trainer.parallel import (
    build_mesh,
    build_schedule,
    init_distributed,
    mesh_shape_of,
    parallelize_stage,
)


def build_parser() -> argparse.ArgumentParser:
    """The command-line flags; defaults are the dataclass defaults."""
    p = argparse.ArgumentParser(prog="python -m ranksight.reference_trainer.train")
    par, mod, opt, run = ParallelConfig(), ModelConfig(), OptimConfig(), TrainConfig()
    p.add_argument("--dp", type=int, default=par.dp, help="data-parallel degree")
    p.add_argument("--tp", type=int, default=par.tp, help="tensor-parallel degree")
    p.add_argument("--pp", type=int, default=par.pp, help="pipeline stages")
    p.add_argument("--microbatches", type=int, default=par.microbatches)
    p.add_argument("--dp-mode", choices=DP_MODES, default=par.dp_mode)
    p.add_argument("--steps", type=int, default=run.steps)
    p.add_argument("--batch-size", type=int, default=run.batch_size, help="sequences/replica")
    p.add_argument("--seq-len", type=int, default=mod.seq_len)
    p.add_argument("--d-model", type=int, default=mod.d_model)
    p.add_argument("--layers", type=int, default=mod.layers)
    p.add_argument(
        "--layer-split",
        type=_layer_split,
        default=None,
        metavar="N,N,...",
        help="blocks per pipeline stage, e.g. 3,1 (pp entries summing to --layers; "
        "default: as even as possible)",
    )
    p.add_argument("--heads", type=int, default=mod.heads)
    p.add_argument("--lr", type=float, default=opt.lr)
    p.add_argument("--warmup", type=int, default=opt.warmup_steps, help="warmup steps")
    p.add_argument("--seed", type=int, default=run.seed)
    p.add_argument("--device", choices=DEVICES, default=run.device)
    p.add_argument("--dtype", choices=DTYPES, default=run.dtype)
    p.add_argument(
        "--inject",
        action="append",
        default=[],
        metavar="FAULT",
        help="fault spec, e.g. slow:rank=3,factor=4,from_step=5 (repeatable; 'none' = clean)",
    )
    p.add_argument("--run-id", default=None, help=f"run id for the hooks (else ${env.RUN_ID})")
    p.add_argument("--log-every", type=int, default=run.log_every)
    p.add_argument(
        "--hooks", choices=HOOK_LEVELS, default=None, help=f"hook level (else ${env.LEVEL}, off)"
    )
    p.add_argument("--summary", default=None, help="write a JSON summary to this path")
    return p


def _layer_split(text: str) -> tuple[int, ...]:
    """``"3,1"`` -> ``(3, 1)``; argparse names ``--layer-split`` in the error it raises."""
    parts = [p.strip() for p in text.split(",")]
    if not all(p.isdigit() for p in parts):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a comma-separated list of block counts like 3,1"
        )
    return tuple(int(p) for p in parts)


def config_from_args(argv: Sequence[str] | None = None) -> TrainConfig:
    """Parse ``argv`` into a validated :class:`TrainConfig`.

    The world size is taken from torchrun's WORLD_SIZE when set. Raises ValueError (from the
    config dataclasses or the fault parser) on an invalid combination.
    """
    a = build_parser().parse_args(argv)
    world = os.environ.get("WORLD_SIZE")
    hooks = a.hooks or os.environ.get(env.LEVEL) or "off"
    return TrainConfig(
        parallel=ParallelConfig(
            dp=a.dp,
            tp=a.tp,
            pp=a.pp,
            microbatches=a.microbatches,
            dp_mode=a.dp_mode,
            layer_split=a.layer_split,
            world_size=int(world) if world else None,
        ),
        model=ModelConfig(d_model=a.d_model, layers=a.layers, heads=a.heads, seq_len=a.seq_len),
        optim=OptimConfig(lr=a.lr, warmup_steps=a.warmup),
        steps=a.steps,
        batch_size=a.batch_size,
        seed=a.seed,
        device=a.device,
        dtype=a.dtype,
        faults=parse_faults(a.inject),
        run_id=a.run_id,
        log_every=a.log_every,
        hooks=hooks,
        summary=a.summary,
    )


@dataclass(frozen=True, slots=True)
class StepResult:
    """What one step left on this rank."""

    step: int
    """Step number (0-based, as passed to ``hooks.step``)."""
    loss: float | None
    """Mean microbatch loss in nats/byte of this DP replica (last stage only, else None)."""
    lr: float
    """Learning rate used."""
    seconds: float
    """Wall time of the step on this rank (s)."""


@dataclass(slots=True)
class Trainer:
    """One rank's training state, built by :func:`build_trainer`."""

    cfg: TrainConfig
    device: torch.device
    coords: dict[str, int]
    """This rank's {"dp", "tp", "pp"} mesh coordinates."""
    hooks: TrainerHooks
    module: torch.nn.Module
    """This stage's TP-sharded, DP-wrapped GPTStage."""
    stage: Any
    """The ``PipelineStage`` (fault wrappers inside, hook wrappers outside)."""
    schedule: Any
    """The ``Schedule1F1B`` driving ``stage``."""
    optimizer: torch.optim.Optimizer
    sampler: ByteWindowSampler
    clock: StepClock
    """Current step, read by the fault injectors."""
    faults: FaultRuntime
    """Faults installed on this rank (usually none)."""


def build_trainer(cfg: TrainConfig, device: torch.device) -> Trainer:
    """Hooks, mesh, model stage, pipeline schedule, faults and optimizer for this rank.

    Needs the default process group. Faults are installed around the hooks as
    :mod:`~ranksight.reference_trainer.fault_runtime` says: communication delays under the
    hooks' dispatch mode, hang/desync over it, compute faults inside their stage timing.
    """
    rank, shape = dist.get_rank(), mesh_shape_of(cfg)
    coords = coords_of(rank, shape)
    meta = {
        "config": cfg.to_record(),
        "faults": faults_ground_truth(cfg.faults, shape),
        **flops_meta(cfg.model, device.type, _device_name(device), cfg.dtype),
    }
    clock = StepClock()
    faults = FaultRuntime(cfg.faults, rank=rank, shape=shape, clock=clock, device=device)
    faults.enter_below_hooks()
    hooks = attach_hooks(
        level=cfg.hooks, run_id=cfg.run_id, mesh=coords, mesh_shape=shape, meta=meta
    )
    mesh = build_mesh(cfg, device)
    module = parallelize_stage(cfg, mesh, device)
    stage, schedule = build_schedule(cfg, module, mesh, device)
    faults.install_stage(stage, module)
    faults.enter_above_hooks()
    hooks.instrument_pipeline_stage(stage)
    sampler = ByteWindowSampler(
        seq_len=cfg.model.seq_len, batch_size=cfg.batch_size, dp_rank=coords["dp"], seed=cfg.seed
    )
    return Trainer(
        cfg=cfg,
        device=device,
        coords=coords,
        hooks=hooks,
        module=module,
        stage=stage,
        schedule=schedule,
        optimizer=build_optimizer(module, cfg.optim),
        sampler=sampler,
        clock=clock,
        faults=faults,
    )


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else device.type


def train_step(t: Trainer, step: int) -> StepResult:
    """Run step ``step`` (0-based): data, 1F1B forward/backward + DP reduction, optimizer."""
    start = time.perf_counter()
    t.clock.step = step
    t.faults.on_step(step)
    with t.hooks.step(step) as record:
        with t.hooks.phase("data_wait"):
            t.faults.on_data(step)
            batch = t.sampler.batch(step)
            inputs, targets = batch.inputs.to(t.device), batch.targets.to(t.device)
        t.faults.before_compute(step)
        lr = lr_at(step, t.cfg.optim, t.cfg.steps)
        set_lr(t.optimizer, lr)
        losses: list[torch.Tensor] = []
        args = (inputs,) if t.stage.is_first else ()
        kwargs: dict[str, Any] = {"target": targets, "losses": losses} if t.stage.is_last else {}
        t.schedule.step(*args, **kwargs)
        with t.hooks.phase("optimizer"):
            t.optimizer.step()
            t.optimizer.zero_grad(set_to_none=True)
        loss = torch.stack(losses).mean().item() if losses else None
        record.set(loss=loss, tokens=batch.tokens, lr=lr)
    if t.device.type == "cuda":
        torch.cuda.synchronize(t.device)
    return StepResult(step=step, loss=loss, lr=lr, seconds=time.perf_counter() - start)


def _is_logger(t: Trainer) -> bool:
    return t.coords == {"dp": 0, "tp": 0, "pp": t.cfg.parallel.pp - 1}


def _log_start(t: Trainer) -> None:
    cfg = t.cfg
    per_stage = [
        len(stage_layers(cfg.model.layers, cfg.parallel.pp, s, cfg.parallel.layer_split))
        for s in range(cfg.parallel.pp)
    ]
    print(
        f"ranksight reference trainer: {count_params(cfg.model):,} params, "
        f"dp={cfg.parallel.dp} tp={cfg.parallel.tp} pp={cfg.parallel.pp} "
        f"({cfg.parallel.dp_mode}), blocks per stage {per_stage}, "
        f"{counted(cfg.parallel.microbatches, 'microbatch', 'microbatches')}, device {t.device}, dtype {cfg.dtype}, "
        f"faults {[s.text for s in cfg.faults] or 'none'}, steps 0..{cfg.steps - 1}",
        flush=True,
    )


def _log_step(t: Trainer, r: StepResult) -> None:
    tokens = t.cfg.batch_size * t.cfg.model.seq_len * t.cfg.parallel.dp
    print(
        f"step {r.step:4d} loss {r.loss:.4f} lr {r.lr:.2e} "
        f"time {r.seconds * 1e3:7.1f} ms  {tokens / r.seconds:8.0f} tok/s",
        flush=True,
    )


def _summary(t: Trainer, results: list[StepResult]) -> dict[str, Any]:
    """Gather every rank's step times (a collective: all ranks call it) into the summary."""
    mine = {
        "rank": dist.get_rank(),
        "seconds": [r.seconds for r in results],
        "injected_seconds": t.faults.injected_s,
    }
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, mine)
    shape = mesh_shape_of(t.cfg)
    return {
        "config": t.cfg.to_record(),
        "faults": faults_ground_truth(t.cfg.faults, shape),
        "params": count_params(t.cfg.model),
        "mesh_shape": shape,
        "world_size": dist.get_world_size(),
        "device": t.device.type,
        "torch": torch.__version__,
        "steps": [{"step": r.step, "loss": r.loss, "lr": r.lr} for r in results],
        "step_seconds_by_rank": {g["rank"]: g["seconds"] for g in gathered},
        "injected_seconds_by_rank": {g["rank"]: g["injected_seconds"] for g in gathered},
    }


def train(cfg: TrainConfig) -> dict[str, Any] | None:
    """Train under torchrun; return the summary on the logging rank, None elsewhere."""
    device = init_distributed(cfg.device)
    t = None
    try:
        t = build_trainer(cfg, device)
        logger = _is_logger(t)
        if logger:
            _log_start(t)
        results = []
        for step in range(cfg.steps):
            results.append(train_step(t, step))
            if logger and (step % cfg.log_every == 0 or step == cfg.steps - 1):
                _log_step(t, results[-1])
        t.faults.exit_above_hooks()
        t.hooks.close()
        t.faults.close()
        summary = _summary(t, results)
        if not logger:
            return None
        if cfg.summary:
            Path(cfg.summary).write_text(json.dumps(summary, indent=1))
        return summary
    finally:
        if t is not None:
            t.faults.close()  # busy processes of a cpu_contention die with the job
        dist.destroy_process_group()


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the exit code (2 on an invalid configuration)."""
    try:
        cfg = config_from_args(argv)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    train(cfg)
    return 0


if __name__ == "__main__":
    sys.exit(main())
