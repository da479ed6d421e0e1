"""AdamW and the learning-rate schedule (linear warmup, cosine decay)."""

from __future__ import annotations

import math

import torch
from torch import nn

from ranksight.reference_trainer.config import OptimConfig


def lr_at(step: int, cfg: OptimConfig, total_steps: int) -> float:
    """Learning rate at ``step`` (0-based) of ``total_steps``.

    Linear warmup ``lr * (step + 1) / warmup_steps`` up to ``lr``, then cosine decay to
    ``lr * min_lr_ratio`` at the last step, ``total_steps - 1``.
    """
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    decay_steps = total_steps - 1 - cfg.warmup_steps
    if decay_steps <= 0:
        return cfg.lr
    progress = min(1.0, (step - cfg.warmup_steps) / decay_steps)
    floor = cfg.lr * cfg.min_lr_ratio
    return floor + (cfg.lr - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def build_optimizer(module: nn.Module, cfg: OptimConfig) -> torch.optim.AdamW:
    """AdamW over ``module``'s parameters; weight decay on matrices only (not norms, biases)."""
    params = [p for p in module.parameters() if p.requires_grad]
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    groups = [
        {"params": decay, "weight_decay": cfg.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.95))


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Set ``lr`` on every parameter group."""
    for group in optimizer.param_groups:
        group["lr"] = lr
