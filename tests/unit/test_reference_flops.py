"""Model FLOPs per token of the reference GPT (PaLM's 6N + 12LHQT) against the matmul
FLOPs torch's FlopCounterMode counts in a real forward and backward; peak FLOP/s lookup."""

from __future__ import annotations

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from ranksight.reference_trainer.config import ModelConfig
from ranksight.reference_trainer.flops import (
    flops_meta,
    matmul_params,
    model_flops_per_token,
    peak_flops,
)
from ranksight.reference_trainer.model import GPTStage, count_params


def test_model_flops_per_token_are_the_matmul_flops_of_a_training_step():
    cfg = ModelConfig(d_model=64, layers=2, heads=2, seq_len=32)
    model = GPTStage(cfg, range(cfg.layers), first=True, last=True)
    batch = torch.randint(0, cfg.vocab_size, (3, cfg.seq_len))
    # the math attention kernel runs as bmm, which the counter sees (the fused CPU one not)
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model(batch).float().sum().backward()
    per_token = counter.get_total_flops() / batch.numel()
    # N counts biases and norm weights too (PaLM's N is the parameter count); no matmul
    # runs over them, which is the whole difference
    vectors = sum(p.numel() for p in model.parameters() if p.dim() == 1)
    assert per_token == model_flops_per_token(cfg) - 6 * vectors
    attention = counter.get_flop_counts()["Global"][torch.ops.aten.bmm] / batch.numel()
    assert attention == 12 * cfg.layers * cfg.d_model * cfg.seq_len  # the 12LHQT term


def test_n_leaves_out_the_embedding_lookups_only():
    cfg = ModelConfig()
    assert matmul_params(cfg) == count_params(cfg) - (cfg.vocab_size + cfg.seq_len) * cfg.d_model


def test_peak_flops_known_for_datasheet_gpus_and_unknown_for_cpu():
    assert peak_flops("cuda", "NVIDIA H100 80GB HBM3", "bf16")[0] == 989.4e12
    assert peak_flops("cuda", "NVIDIA H100 PCIe", "fp32")[0] == 51.2e12
    assert peak_flops("cuda", "NVIDIA A100-SXM4-80GB", "bf16")[0] == 312e12
    for args in (("cpu", "cpu", "fp32"), ("cuda", "Tesla T4", "fp32")):
        peak, why = peak_flops(*args)
        assert peak is None and why.startswith("unknown")
    meta = flops_meta(ModelConfig(), "cpu", "cpu", "fp32")
    assert meta["peak_flops_per_rank"] is None and meta["model_flops_per_token"] > 0
    assert "PaLM" in meta["model_flops_formula"]
