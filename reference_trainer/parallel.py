"""3D parallelism with PyTorch's own building blocks: DTensor TP, pipelining PP, FSDP2 DP.

Order of operations on every rank (``train.build_trainer`` runs them):

1. :func:`init_distributed`: ``init_process_group`` (gloo on CPU, NCCL on CUDA) first.
2. :func:`build_mesh`: ``init_device_mesh(device, (dp, pp, tp), ("dp", "pp", "tp"))``;
   the rank layout is in :mod:`ranksight.ground.mesh`.
3. :func:`parallelize_stage`: build this rank's pipeline stage module, shard it over the
   ``tp`` sub-mesh with ``parallelize_module`` (q/k/v and MLP-in column-wise, attention-out
   and MLP-out row-wise, token embedding row-wise, LM head column-wise), move it to the
   device, and wrap it with FSDP2 ``replicate`` or ``fully_shard`` over the ``dp`` sub-mesh.
   (DDP over DTensor-TP modules fails in ``DDP.__init__``; FSDP2 composes with TP and with
   ``torch.distributed.pipelining``, whose ``PipelineStage`` defers the DP gradient
   reduction to ``perform_reduce_grad`` after the last microbatch.)
4. :func:`build_schedule`: ``PipelineStage`` over the ``pp`` sub-mesh's group and
   ``Schedule1F1B``.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.pipelining import PipelineStage, Schedule1F1B
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    RowwiseParallel,
    parallelize_module,
)

from ranksight.ground.mesh import MESH_DIM_NAMES, coords_of
from ranksight.reference_trainer.config import TrainConfig
from ranksight.reference_trainer.model import GPTStage, build_stage

replicate: Callable[..., object] | None
try:  # FSDP2-based replicate (torch >= 2.9); older torch falls back to fully_shard.
    from torch.distributed._composable.replicate_with_fsdp import replicate
except ImportError:  # pragma: no cover - depends on the torch build
    replicate = None


def init_distributed(device: str) -> torch.device:
    """Initialise the default process group from torchrun's environment; return this rank's device.

    ``device`` is ``cpu`` (gloo) or ``cuda`` (NCCL; binds GPU LOCAL_RANK first).
    Raises RuntimeError if ``cuda`` is asked for and not available.
    """
    if device == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("--device cuda but torch.cuda.is_available() is False")
        local = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(local)
        dist.init_process_group(backend="nccl", device_id=local)
        return local
    dist.init_process_group(backend="gloo")
    return torch.device("cpu")


def build_mesh(cfg: TrainConfig, device: torch.device) -> DeviceMesh:
    """The (dp, pp, tp) device mesh over the default process group.

    Raises RuntimeError if torch places this rank at other coordinates than
    :func:`~ranksight.ground.mesh.coords_of` says (the documented layout).
    """
    par = cfg.parallel
    mesh = init_device_mesh(device.type, (par.dp, par.pp, par.tp), mesh_dim_names=MESH_DIM_NAMES)
    got = dict(zip(MESH_DIM_NAMES, mesh.get_coordinate() or (), strict=True))
    want = coords_of(dist.get_rank(), mesh_shape_of(cfg))
    if any(got[name] != want[name] for name in MESH_DIM_NAMES):
        raise RuntimeError(f"rank {dist.get_rank()}: mesh coordinates {got} != layout {want}")
    return mesh


def mesh_shape_of(cfg: TrainConfig) -> dict[str, int]:
    """The mesh degrees {"dp", "tp", "pp"} of ``cfg``."""
    return {"dp": cfg.parallel.dp, "tp": cfg.parallel.tp, "pp": cfg.parallel.pp}


def tp_plan(module: GPTStage) -> dict[str, ParallelStyle]:
    """Megatron-style TP plan for one stage: each block costs 2 all_reduce forward, 2 backward.

    Attention heads and MLP columns are split over tp; the embedding splits the vocabulary
    (an all_reduce of its output), the LM head its output columns (an all_gather of logits).
    """
    plan: dict[str, ParallelStyle] = {}
    if module.tok_emb is not None:
        plan["tok_emb"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate())
    for name in module.blocks:
        prefix = f"blocks.{name}"
        for proj in ("attn.q", "attn.k", "attn.v", "mlp.fc_in"):
            plan[f"{prefix}.{proj}"] = ColwiseParallel()
        for proj in ("attn.out", "mlp.fc_out"):
            plan[f"{prefix}.{proj}"] = RowwiseParallel()
    if module.head is not None:
        plan["head"] = ColwiseParallel(output_layouts=Replicate())
    return plan


def _wrap_dp(module: GPTStage, dp_mesh: DeviceMesh, cfg: TrainConfig) -> None:
    # The last stage returns its logits through ColwiseParallel's to_local(), a view; FSDP2
    # warns because an in-place op on it would skip its pre-backward hook. The loss reads
    # the logits out of place, so the warning (once per rank) is noise.
    warnings.filterwarnings(
        "ignore", message=r"FSDP2-wrapped module .* returned a view tensor", category=UserWarning
    )
    mp = MixedPrecisionPolicy(
        param_dtype=torch.bfloat16 if cfg.dtype == "bf16" else None, reduce_dtype=torch.float32
    )
    if cfg.parallel.dp_mode == "replicate" and replicate is not None:
        for block in module.blocks.values():
            replicate(block, mesh=dp_mesh, mp_policy=mp)
        replicate(module, mesh=dp_mesh, mp_policy=mp)
        return
    for block in module.blocks.values():
        # Keep parameters unsharded between the microbatches of a step: one all_gather
        # per block per step instead of one per microbatch forward and backward.
        fully_shard(block, mesh=dp_mesh, mp_policy=mp, reshard_after_forward=False)
    fully_shard(module, mesh=dp_mesh, mp_policy=mp, reshard_after_forward=False)


def parallelize_stage(cfg: TrainConfig, mesh: DeviceMesh, device: torch.device) -> GPTStage:
    """This rank's pipeline stage module: built on CPU, TP-sharded, moved, DP-wrapped."""
    pp_idx = mesh.get_local_rank("pp")
    module = build_stage(cfg.model, cfg.parallel.pp, pp_idx, cfg.seed, cfg.parallel.layer_split)
    module.to(device)
    if cfg.parallel.tp > 1:
        parallelize_module(module, mesh["tp"], tp_plan(module))
    _wrap_dp(module, mesh["dp"], cfg)
    return module


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-byte cross entropy (nats): logits (B, T, V), targets (B, T) int64 -> scalar."""
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


def build_schedule(
    cfg: TrainConfig, module: GPTStage, mesh: DeviceMesh, device: torch.device
) -> tuple[PipelineStage, Schedule1F1B]:
    """The ``PipelineStage`` of this rank (P2P on the ``pp`` sub-mesh) and its 1F1B schedule.

    Stage input/output shapes are inferred by the stage at the first ``schedule.step``.
    """
    stage = PipelineStage(
        module,
        stage_index=mesh.get_local_rank("pp"),
        num_stages=cfg.parallel.pp,
        device=device,
        group=mesh["pp"].get_group(),
    )
    schedule = Schedule1F1B(stage, n_microbatches=cfg.parallel.microbatches, loss_fn=lm_loss)
    return stage, schedule
