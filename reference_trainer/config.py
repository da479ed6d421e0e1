"""Configuration of the reference trainer: one small dataclass per component.

Each dataclass checks its own fields in ``__post_init__``; :class:`TrainConfig` checks the
rules that tie components together (heads vs. TP degree, layers vs. PP degree, ...).
Every rule raises :class:`ValueError` with a message that names the offending values.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ranksight.reference_trainer.faults import FaultSpec

DEVICES = ("cpu", "cuda")
"""Device kinds: ``cpu`` runs on gloo, ``cuda`` on NCCL."""
DTYPES = ("fp32", "bf16")
"""Compute dtypes; ``bf16`` uses FSDP2 mixed precision (params bf16, gradient reduce fp32)."""
DP_MODES = ("replicate", "fsdp")
"""Data-parallel flavours: FSDP2 ``replicate`` (all_reduce of gradients) or ``fully_shard``."""
HOOK_LEVELS = ("off", "default", "detailed")
"""``ranksight.trainer_hooks`` levels the trainer can ask for."""


def _split_text(split: tuple[int, ...]) -> str:
    return ",".join(map(str, split))


def _require_positive(owner: str, **values: int) -> None:
    for name, value in values.items():
        if value < 1:
            raise ValueError(f"{owner}.{name} must be >= 1, got {value}")


@dataclass(kw_only=True, slots=True)
class ParallelConfig:
    """The 3D mesh: data x tensor x pipeline parallel degrees."""

    dp: int = 1
    """Data-parallel degree: model replicas, each on its own slice of every batch."""
    tp: int = 1
    """Tensor-parallel degree: attention heads and MLP columns are split over this many ranks."""
    pp: int = 1
    """Pipeline-parallel degree: number of pipeline stages (consecutive groups of blocks)."""
    microbatches: int = 4
    """Microbatches per step fed through the 1F1B pipeline schedule (must be >= pp)."""
    dp_mode: str = "replicate"
    """How the DP replicas keep in sync: ``replicate`` or ``fsdp`` (FSDP2 ``fully_shard``)."""
    world_size: int | None = None
    """Ranks actually launched (torchrun's WORLD_SIZE); None means dp * tp * pp."""
    layer_split: tuple[int, ...] | None = None
    """Blocks per pipeline stage, first stage first (``--layer-split 3,1``): pp entries,
    each >= 1, summing to ``model.layers``; None splits the blocks as evenly as possible."""

    def __post_init__(self) -> None:
        _require_positive(
            "parallel", dp=self.dp, tp=self.tp, pp=self.pp, microbatches=self.microbatches
        )
        self._check_layer_split()
        if self.dp_mode not in DP_MODES:
            raise ValueError(f"parallel.dp_mode must be one of {DP_MODES}, got {self.dp_mode!r}")
        if self.microbatches < self.pp:
            raise ValueError(
                f"parallel.microbatches ({self.microbatches}) must be >= pp ({self.pp}): "
                "Schedule1F1B needs at least one microbatch per stage"
            )
        if self.world_size is not None and self.world_size != self.mesh_size:
            raise ValueError(
                f"world size {self.world_size} != dp*tp*pp = {self.dp}*{self.tp}*{self.pp} "
                f"= {self.mesh_size}"
            )

    def _check_layer_split(self) -> None:
        split = self.layer_split
        if split is None:
            return
        if len(split) != self.pp:
            raise ValueError(
                f"parallel.layer_split (--layer-split) {_split_text(split)} has "
                f"{len(split)} entries, want one per pipeline stage (pp = {self.pp})"
            )
        if any(n < 1 for n in split):
            raise ValueError(
                f"parallel.layer_split (--layer-split) {_split_text(split)}: every stage "
                "needs at least one block (entries >= 1)"
            )

    @property
    def mesh_size(self) -> int:
        """Ranks in the mesh, dp * tp * pp."""
        return self.dp * self.tp * self.pp


@dataclass(kw_only=True, slots=True)
class ModelConfig:
    """Shape of the byte-level GPT."""

    d_model: int = 256
    """Width of the residual stream (embedding size)."""
    layers: int = 4
    """Transformer blocks."""
    heads: int = 4
    """Attention heads per block; d_model must divide by it."""
    seq_len: int = 128
    """Context length in tokens (bytes)."""
    vocab_size: int = 256
    """Vocabulary size; 256 for raw bytes."""
    mlp_ratio: int = 4
    """Hidden width of the MLP as a multiple of d_model."""

    def __post_init__(self) -> None:
        _require_positive(
            "model",
            d_model=self.d_model,
            layers=self.layers,
            heads=self.heads,
            seq_len=self.seq_len,
            vocab_size=self.vocab_size,
            mlp_ratio=self.mlp_ratio,
        )
        if self.d_model % self.heads:
            raise ValueError(
                f"model.d_model ({self.d_model}) must be divisible by model.heads ({self.heads})"
            )


@dataclass(kw_only=True, slots=True)
class OptimConfig:
    """AdamW with linear warmup and cosine decay."""

    lr: float = 1e-3
    """Peak learning rate, reached at the end of warmup."""
    warmup_steps: int = 5
    """Steps of linear warmup: lr * (step + 1) / warmup_steps until it reaches lr."""
    min_lr_ratio: float = 0.1
    """Cosine decay ends at lr * min_lr_ratio at the last step."""
    weight_decay: float = 0.1
    """AdamW decoupled weight decay."""

    def __post_init__(self) -> None:
        if not self.lr > 0:
            raise ValueError(f"optim.lr must be > 0, got {self.lr}")
        if self.warmup_steps < 0:
            raise ValueError(f"optim.warmup_steps must be >= 0, got {self.warmup_steps}")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f"optim.min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        if self.weight_decay < 0:
            raise ValueError(f"optim.weight_decay must be >= 0, got {self.weight_decay}")


@dataclass(kw_only=True, slots=True)
class TrainConfig:
    """Everything one training run needs; cross-component rules are checked here."""

    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    """Mesh degrees and pipeline microbatches."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """Model shape."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """Optimizer and learning-rate schedule."""
    steps: int = 30
    """Optimizer steps to run, numbered 0 .. steps - 1."""
    batch_size: int = 8
    """Sequences per step per DP replica; split into ``parallel.microbatches`` microbatches."""
    seed: int = 0
    """Seed for weights (per layer, so every pp split builds the same model) and data."""
    device: str = "cpu"
    """``cpu`` (gloo) or ``cuda`` (NCCL)."""
    dtype: str = "fp32"
    """``fp32`` or ``bf16`` compute."""
    faults: tuple[FaultSpec, ...] = ()
    """Faults to inject; they are also the run's ground truth."""
    run_id: str | None = None
    """Run id handed to the hooks (else taken from RANKSIGHT_RUN_ID)."""
    log_every: int = 5
    """Print the loss every this many steps (on the last stage's dp=0, tp=0 rank)."""
    hooks: str = "off"
    """``ranksight.trainer_hooks`` level: ``off`` or ``default``."""
    summary: str | None = None
    """Path of a JSON summary (losses, step times, faults) written by global rank 0."""

    def __post_init__(self) -> None:
        _require_positive(
            "train", steps=self.steps, batch_size=self.batch_size, log_every=self.log_every
        )
        if self.device not in DEVICES:
            raise ValueError(f"device must be one of {DEVICES}, got {self.device!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.hooks not in HOOK_LEVELS:
            raise ValueError(f"hooks must be one of {HOOK_LEVELS}, got {self.hooks!r}")
        self._check_mesh_fits_model()
        if self.batch_size % self.parallel.microbatches:
            raise ValueError(
                f"batch_size ({self.batch_size}) must be divisible by "
                f"microbatches ({self.parallel.microbatches})"
            )
        world = self.parallel.mesh_size
        for spec in self.faults:
            if spec.rank is not None and spec.rank >= world:
                raise ValueError(
                    f"fault {spec.text!r} targets rank {spec.rank} but world size is {world}"
                )

    def _check_mesh_fits_model(self) -> None:
        tp, pp, m = self.parallel.tp, self.parallel.pp, self.model
        if m.heads % tp:
            raise ValueError(f"model.heads ({m.heads}) must be divisible by tp ({tp})")
        if (m.d_model * m.mlp_ratio) % tp:
            raise ValueError(
                f"MLP width d_model*mlp_ratio ({m.d_model * m.mlp_ratio}) must be divisible "
                f"by tp ({tp})"
            )
        if m.vocab_size % tp:
            raise ValueError(f"model.vocab_size ({m.vocab_size}) must be divisible by tp ({tp})")
        if m.layers < pp:
            raise ValueError(
                f"model.layers ({m.layers}) must be >= pp ({pp}): every stage needs a block"
            )
        split = self.parallel.layer_split
        if split is not None and sum(split) != m.layers:
            raise ValueError(
                f"parallel.layer_split (--layer-split) {_split_text(split)} sums to "
                f"{sum(split)} blocks, want model.layers ({m.layers})"
            )

    def to_record(self) -> dict[str, Any]:
        """The config as plain JSON-able data (faults as their spec strings)."""
        out = asdict(self)
        out["faults"] = [spec.text for spec in self.faults]
        return out
