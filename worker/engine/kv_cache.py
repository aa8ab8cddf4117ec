"""The paged KV cache tensor of one model, sized from a memory budget and resizable.

Layout: ``[layers, 2, num_blocks, block_size, kv_heads, head_dim]`` (see nj_kernels/kv_ops.py).
Resizing applies the block manager's evacuation moves with ``copy_blocks`` before the tail is
cut off, so the live contents of every sequence survive a shrink.
"""

from __future__ import annotations

import torch

from nj_kernels.kv_ops import copy_blocks
from worker.engine.model_config import ModelConfig


def bytes_per_block(config: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    elem = torch.empty((), dtype=dtype).element_size()
    return config.num_layers * 2 * block_size * config.num_kv_heads * config.head_dim * elem


def blocks_for_budget(
    config: ModelConfig, block_size: int, dtype: torch.dtype, budget_bytes: int, weight_bytes: int
) -> int:
    """Blocks that fit in what the budget leaves after the weights."""
    free = budget_bytes - weight_bytes
    per_block = bytes_per_block(config, block_size, dtype)
    if free < per_block:
        raise ValueError(
            f"memory budget {budget_bytes} B leaves {free} B after {weight_bytes} B of weights: "
            f"not even one KV block ({per_block} B)"
        )
    return free // per_block


class KVCache:
    def __init__(
        self,
        config: ModelConfig,
        num_blocks: int,
        block_size: int,
        device: torch.device,
        dtype: torch.dtype,
    ) -> None:
        self.config, self.block_size = config, block_size
        self.device, self.dtype = device, dtype
        # Zeros, not empty: padded pages are masked in attention, but 0·NaN would still be NaN.
        self.kv = torch.zeros(self._shape(num_blocks), device=device, dtype=dtype)

    def _shape(self, num_blocks: int) -> tuple[int, ...]:
        c = self.config
        return (c.num_layers, 2, num_blocks, self.block_size, c.num_kv_heads, c.head_dim)

    @property
    def num_blocks(self) -> int:
        return int(self.kv.shape[2])

    @property
    def nbytes(self) -> int:
        return self.kv.numel() * self.kv.element_size()

    def copy(self, moves: list[tuple[int, int]]) -> None:
        """Copy whole blocks ``src -> dst`` (copy-on-write, evacuation)."""
        if not moves:
            return
        src = torch.tensor([m[0] for m in moves], dtype=torch.long, device=self.device)
        dst = torch.tensor([m[1] for m in moves], dtype=torch.long, device=self.device)
        copy_blocks(self.kv, src, dst)

    def resize(self, num_blocks: int, moves: list[tuple[int, int]]) -> None:
        """Apply evacuation ``moves`` (from ``BlockManager.resize``), then reallocate the
        tensor with ``num_blocks`` blocks, keeping blocks below the smaller size."""
        self.copy(moves)
        keep = min(num_blocks, self.num_blocks)
        new = torch.zeros(self._shape(num_blocks), device=self.device, dtype=self.dtype)
        new[:, :, :keep] = self.kv[:, :, :keep]
        self.kv = new
