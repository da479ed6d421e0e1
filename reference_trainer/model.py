"""A small byte-level GPT, built one pipeline stage at a time.

Shapes: B = microbatch size, T = sequence length, D = d_model, V = vocabulary (256).
Every block is pre-norm: ``h + attn(ln(h))`` then ``h + mlp(ln(h))``. Attention uses
separate q/k/v projections so that ``ColwiseParallel`` splits them by whole heads, and it
reads the number of local heads from the projection's output width, so the same code runs
unsharded and tensor-parallel.

Weights are drawn from a generator seeded by (seed, layer), not by the order modules are
built, so any pipeline split builds exactly the same model.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ranksight.reference_trainer.config import ModelConfig

_EMBED_SEED = 1_000_003
_HEAD_SEED = 2_000_003


class Attention(nn.Module):
    """Causal multi-head self-attention: (B, T, D) -> (B, T, D)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.head_dim = cfg.d_model // cfg.heads
        self.q = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.k = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.v = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.out = nn.Linear(cfg.d_model, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        # Under TP each projection holds heads/tp whole heads: -1 is the local head count.
        q, k, v = (
            proj(x).view(batch, seq, -1, self.head_dim).transpose(1, 2)
            for proj in (self.q, self.k, self.v)
        )
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(batch, seq, -1))


class MLP(nn.Module):
    """Two-layer GELU MLP: (B, T, D) -> (B, T, D), hidden width D * mlp_ratio."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.fc_in = nn.Linear(cfg.d_model, cfg.d_model * cfg.mlp_ratio)
        self.fc_out = nn.Linear(cfg.d_model * cfg.mlp_ratio, cfg.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc_out(F.gelu(self.fc_in(x)))


class Block(nn.Module):
    """One pre-norm transformer block: (B, T, D) -> (B, T, D)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.attn_norm = nn.LayerNorm(cfg.d_model)
        self.attn = Attention(cfg)
        self.mlp_norm = nn.LayerNorm(cfg.d_model)
        self.mlp = MLP(cfg)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        h = h + self.attn(self.attn_norm(h))
        return h + self.mlp(self.mlp_norm(h))


class GPTStage(nn.Module):
    """The part of the GPT one pipeline stage holds.

    The first stage maps token ids (B, T) int64 to hidden states (B, T, D) through the token
    and position embeddings; the last stage maps hidden states to logits (B, T, V) through the
    final norm and the LM head; a single stage (pp = 1) does both. ``blocks`` is keyed by
    global layer index, so parameter names do not depend on the split.
    """

    def __init__(self, cfg: ModelConfig, layer_ids: range, *, first: bool, last: bool) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model) if first else None
        self.pos_emb = nn.Embedding(cfg.seq_len, cfg.d_model) if first else None
        self.blocks = nn.ModuleDict({str(i): Block(cfg) for i in layer_ids})
        self.norm = nn.LayerNorm(cfg.d_model) if last else None
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False) if last else None

    @torch.no_grad()
    def init_weights(self, seed: int) -> None:
        """GPT-2 style init: N(0, 0.02), residual output projections N(0, 0.02/sqrt(2L))."""
        if self.tok_emb is not None and self.pos_emb is not None:
            gen = torch.Generator().manual_seed(seed * 7_919 + _EMBED_SEED)
            for weight in (self.tok_emb.weight, self.pos_emb.weight):
                _normal(weight, 0.02, gen)
        residual_std = 0.02 / math.sqrt(2 * self.cfg.layers)
        for name, block in self.blocks.items():
            if not isinstance(block, Block):
                raise TypeError(f"blocks[{name!r}] is a {type(block).__name__}, not a Block")
            gen = torch.Generator().manual_seed(seed * 7_919 + int(name))
            for linear in (block.attn.q, block.attn.k, block.attn.v, block.mlp.fc_in):
                _normal(linear.weight, 0.02, gen)
            for linear in (block.attn.out, block.mlp.fc_out):
                _normal(linear.weight, residual_std, gen)
            for bias in (block.mlp.fc_in.bias, block.mlp.fc_out.bias):
                bias.zero_()
        if self.head is not None:
            _normal(
                self.head.weight, 0.02, torch.Generator().manual_seed(seed * 7_919 + _HEAD_SEED)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tok_emb is not None and self.pos_emb is not None:
            positions = torch.arange(x.shape[1], device=x.device)
            h = self.tok_emb(x) + self.pos_emb(positions)
        else:
            h = x
        for block in self.blocks.values():
            h = block(h)
        if self.norm is not None and self.head is not None:
            return self.head(self.norm(h))
        return h


def _normal(weight: torch.Tensor, std: float, gen: torch.Generator) -> None:
    # Drawn on the CPU so the numbers do not depend on the device.
    weight.copy_(torch.randn(weight.shape, generator=gen) * std)


def stage_layers(layers: int, pp: int, stage: int, split: Sequence[int] | None = None) -> range:
    """Global indices of the blocks pipeline ``stage`` holds (0-based).

    ``split``: blocks per stage, first stage first (the trainer's ``--layer-split``);
    None splits as evenly as possible, the first ``layers % pp`` stages getting one more.
    Raises ValueError if ``layers < pp``, ``stage`` is not in ``[0, pp)``, or ``split``
    does not have ``pp`` entries, each >= 1, summing to ``layers``.
    """
    if layers < pp:
        raise ValueError(f"cannot split {layers} layers over {pp} pipeline stages")
    if not 0 <= stage < pp:
        raise ValueError(f"stage {stage} is outside [0, {pp})")
    if split is not None:
        if len(split) != pp or sum(split) != layers or min(split) < 1:
            raise ValueError(
                f"layer split {list(split)} must have {pp} entries, each >= 1, "
                f"summing to {layers} layers"
            )
        start = sum(split[:stage])
        return range(start, start + split[stage])
    base, extra = divmod(layers, pp)
    start = stage * base + min(stage, extra)
    return range(start, start + base + (1 if stage < extra else 0))


def build_stage(
    cfg: ModelConfig, pp: int, stage: int, seed: int, split: Sequence[int] | None = None
) -> GPTStage:
    """The CPU module of pipeline ``stage`` of ``pp``, weights initialised from ``seed``;
    ``split`` as :func:`stage_layers` takes it."""
    layer_ids = stage_layers(cfg.layers, pp, stage, split)
    module = GPTStage(cfg, layer_ids, first=stage == 0, last=stage == pp - 1)
    module.init_weights(seed)
    return module


def count_params(cfg: ModelConfig) -> int:
    """Parameters of the whole (unsplit) model, counted on the meta device."""
    with torch.device("meta"):
        whole = GPTStage(cfg, range(cfg.layers), first=True, last=True)
    return sum(p.numel() for p in whole.parameters())
