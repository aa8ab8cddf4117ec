"""Engine settings (what ``load_engine(model_dir, **config)`` accepts)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import torch

DEFAULT_KV_BYTES = 1 << 30  # KV memory when neither a budget nor a block count is given

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class EngineConfig:
    block_size: int = 16
    # Target weights + resident drafters (weights and KV pools) + the target's KV cache, bytes;
    # the KV caches share what the weights leave, block for block.
    memory_budget_bytes: int | None = None
    num_blocks: int | None = None  # explicit KV block count (overrides the budget)
    max_num_seqs: int = 64  # running sequences at most
    max_num_batched_tokens: int = 512  # tokens per forward at most (prompts are chunked)
    max_model_len: int | None = None  # cap on prompt + output tokens
    enable_prefix_caching: bool = True
    logits_cache_size: int = 64  # prompts whose next-token logits are kept for exact repeats
    max_gamma: int = 8  # Γmax: the most draft tokens per sequence per step, whatever the planner says
    counterfactual_every: int = 1  # score the other drafters every k-th speculative step (0: never)
    device: str | None = None  # default: cuda when available, else cpu
    dtype: str | None = None  # default: float32 on cpu, bfloat16 on cuda

    def __post_init__(self) -> None:
        if self.block_size < 1 or self.max_num_seqs < 1 or self.max_num_batched_tokens < 1:
            raise ValueError("block_size, max_num_seqs and max_num_batched_tokens must be ≥ 1")
        if self.max_gamma < 0 or self.counterfactual_every < 0:
            raise ValueError("max_gamma and counterfactual_every must be ≥ 0")
        if self.dtype is not None and self.dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(_DTYPES)}")

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> EngineConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise TypeError(f"unknown engine options: {', '.join(unknown)}")
        return cls(**kwargs)

    def torch_device(self) -> torch.device:
        if self.device is not None:
            return torch.device(self.device)
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")

    def torch_dtype(self) -> torch.dtype:
        if self.dtype is not None:
            return _DTYPES[self.dtype]
        return torch.float32 if self.torch_device().type == "cpu" else torch.bfloat16
