"""Byte-level language-modelling data: real English text from Python's own documentation.

The corpus is ``pydoc_data.topics.topics`` (the text behind ``help("TOPIC")``), its values
joined in sorted-key order, UTF-8 encoded: about 466 KB, vocabulary 256 (raw bytes). It
ships with CPython, so every rank has it without downloads.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch

VOCAB_SIZE = 256
"""Byte vocabulary."""


@lru_cache(maxsize=1)
def corpus_bytes() -> bytes:
    """The whole corpus as bytes (~466 KB); identical on every rank and run."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[key] for key in sorted(topics)).encode("utf-8")


@dataclass(frozen=True, slots=True)
class Batch:
    """One step's sequences for one DP replica."""

    inputs: torch.Tensor
    """Token ids, shape (batch, seq_len), int64."""
    targets: torch.Tensor
    """Next-token ids, shape (batch, seq_len), int64: ``inputs`` shifted left by one."""

    @property
    def tokens(self) -> int:
        """Tokens (bytes) predicted in this batch: batch * seq_len."""
        return self.targets.numel()


class ByteWindowSampler:
    """Deterministic random (seq_len + 1)-byte windows of the corpus for one DP replica.

    The windows of a step depend only on (seed, dp_rank, step), so every rank of one DP
    replica (all its TP and PP ranks) draws the same batch without communicating, different
    replicas draw different batches, and a restarted run replays the same data.
    """

    def __init__(self, *, seq_len: int, batch_size: int, dp_rank: int, seed: int) -> None:
        data = np.frombuffer(corpus_bytes(), dtype=np.uint8)
        if seq_len + 1 > data.size:
            raise ValueError(f"seq_len {seq_len} is longer than the corpus ({data.size} bytes)")
        self._data = torch.from_numpy(data.astype(np.int64))
        self.seq_len = seq_len
        self.batch_size = batch_size
        self.dp_rank = dp_rank
        self.seed = seed

    def batch(self, step: int) -> Batch:
        """The batch of ``step``: inputs and targets of shape (batch_size, seq_len), int64."""
        rng = np.random.default_rng([self.seed, self.dp_rank, step])
        starts = rng.integers(0, self._data.numel() - self.seq_len - 1, size=self.batch_size)
        offsets = torch.arange(self.seq_len + 1)
        windows = self._data[torch.from_numpy(starts)[:, None] + offsets[None, :]]
        return Batch(inputs=windows[:, :-1].contiguous(), targets=windows[:, 1:].contiguous())
