"""A real 3D-parallel (DP x TP x PP) byte-level GPT trainer with fault injection.

Run it under torchrun (CPU/gloo or GPU/NCCL, same code)::

    python -m torch.distributed.run --standalone --nproc-per-node 8 \\
        -m ranksight.reference_trainer.train --dp 2 --tp 2 --pp 2 --steps 30 \\
        --inject slow:rank=3,factor=4,from_step=5 --summary summary.json

One file per idea: ``config`` (dataclasses and their rules), ``layout`` (global rank <->
dp/tp/pp coordinates), ``data`` (pydoc text, per-DP-rank windows), ``model`` (GPT built per
pipeline stage), ``parallel`` (process group, device mesh, TP plan, FSDP2, 1F1B schedule),
``faults`` (fault specs and ground truth), ``inject`` (applying faults to a rank),
``optim`` (AdamW, lr schedule), ``_hooks_seam`` (meeting ``ranksight.trainer_hooks``),
``train`` (CLI and loop).

The names below import without torch, so analysis code can read fault specs and layouts.
"""

from ranksight.ground.mesh import MESH_DIM_NAMES, coords_of, rank_of
from ranksight.reference_trainer.config import (
    ModelConfig,
    OptimConfig,
    ParallelConfig,
    TrainConfig,
)
from ranksight.reference_trainer.faults import (
    FAULT_KINDS,
    FaultSpec,
    faults_ground_truth,
    parse_fault,
    parse_faults,
)

__all__ = [
    "FAULT_KINDS",
    "MESH_DIM_NAMES",
    "FaultSpec",
    "ModelConfig",
    "OptimConfig",
    "ParallelConfig",
    "TrainConfig",
    "coords_of",
    "faults_ground_truth",
    "parse_fault",
    "parse_faults",
    "rank_of",
]
