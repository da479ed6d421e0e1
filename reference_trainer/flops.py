"""Model FLOPs of the reference GPT and the peak FLOP/s of the device a rank runs on, so
the run records what MFU needs (``model_flops_per_token``, ``peak_flops_per_rank`` in the
run's meta; the web UI's overview reads them).

Model FLOPs follow the definition of model FLOPs utilization in PaLM (Chowdhery et al.
2022, "PaLM: Scaling Language Modeling with Pathways", appendix B): per token of training
(forward and backward), ``6N + 12LHQT``, with N the parameters that take part in matrix
multiplies (every weight except the token and position embeddings, which are lookups),
L layers, H heads, Q the head dimension and T the sequence length. The attention term
counts the full T x T score matrix, as PaLM does (causal masking is not subtracted).
Rematerialization is not counted: that is what makes it *model* FLOPs.
"""

from __future__ import annotations

from ranksight.reference_trainer.config import ModelConfig
from ranksight.reference_trainer.model import count_params

FORMULA = "6N + 12LHQT (PaLM, Chowdhery et al. 2022, appendix B)"

PEAK_TFLOPS: dict[tuple[str, str], float] = {
    ("H100 SXM", "bf16"): 989.4,
    ("H100 SXM", "fp32"): 66.9,
    ("H100 PCIe", "bf16"): 756.0,
    ("H100 PCIe", "fp32"): 51.2,
    ("H200", "bf16"): 989.4,
    ("H200", "fp32"): 66.9,
    ("A100", "bf16"): 312.0,
    ("A100", "fp32"): 19.5,
}
"""Dense (no sparsity) peak TFLOP/s of one GPU by model and training dtype, from NVIDIA's
H100, H200 and A100 datasheets (bf16: Tensor Core; fp32: without TF32, PyTorch's default
for matmuls)."""


def matmul_params(cfg: ModelConfig) -> int:
    """N of :data:`FORMULA`: the whole model's parameters less the token embedding
    (vocab_size x d_model) and position embedding (seq_len x d_model). Biases and layer
    norm weights stay in (under 0.5% of N at the default shape), as in PaLM's N."""
    embeddings = (cfg.vocab_size + cfg.seq_len) * cfg.d_model
    return count_params(cfg) - embeddings


def model_flops_per_token(cfg: ModelConfig) -> float:
    """Training FLOPs per token (forward and backward) of the whole model, by
    :data:`FORMULA` (H x Q = d_model)."""
    return 6.0 * matmul_params(cfg) + 12.0 * cfg.layers * cfg.d_model * cfg.seq_len


def gpu_model(device_name: str) -> str | None:
    """The :data:`PEAK_TFLOPS` model of a CUDA device name (``torch.cuda.get_device_name``,
    e.g. "NVIDIA H100 80GB HBM3" -> "H100 SXM"), or None for a GPU not in the table."""
    name = device_name.upper()
    if "H200" in name:
        return "H200"
    if "H100" in name:
        return "H100 PCIe" if "PCIE" in name else "H100 SXM"
    if "A100" in name:
        return "A100"
    return None


def peak_flops(device_type: str, device_name: str, dtype: str) -> tuple[float | None, str]:
    """(peak FLOP/s of one rank, where the number comes from). None with the reason when
    it is not known: any CPU (its peak depends on cores, clocks and vector units the job
    cannot see reliably), a GPU not in :data:`PEAK_TFLOPS`."""
    if device_type != "cuda":
        return (
            None,
            f"unknown for {device_type} ranks (it depends on cores, clocks and vector units)",
        )
    model = gpu_model(device_name)
    if model is None or (model, dtype) not in PEAK_TFLOPS:
        return None, f"unknown for {device_name!r} ({dtype}): not in the peak table"
    return PEAK_TFLOPS[(model, dtype)] * 1e12, f"NVIDIA {model} datasheet, {dtype} dense"


def flops_meta(cfg: ModelConfig, device_type: str, device_name: str, dtype: str) -> dict:
    """The run-meta fields MFU needs: model_flops_per_token, peak_flops_per_rank (None
    when unknown), and how each was obtained."""
    peak, source = peak_flops(device_type, device_name, dtype)
    return {
        "model_flops_per_token": model_flops_per_token(cfg),
        "model_flops_formula": FORMULA,
        "matmul_params": matmul_params(cfg),
        "peak_flops_per_rank": peak,
        "peak_flops_source": source,
    }
