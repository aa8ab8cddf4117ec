"""Builders for tiny paged-KV inputs shared by the kernel tests (imported as a plain module:
fixtures would hide the types)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class PagedBatch:
    """One paged_attention call's inputs (argument order of the kernels)."""

    q: torch.Tensor  # [B, Q, H, D]
    k_cache: torch.Tensor  # [NB, BS, KVH, D]
    v_cache: torch.Tensor
    block_tables: torch.Tensor  # [B, MAXB] int32
    context_lens: torch.Tensor  # [B] int64
    query_lens: torch.Tensor  # [B] int64
    scale: float

    def args(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                            torch.Tensor, float]:
        return (self.q, self.k_cache, self.v_cache, self.block_tables, self.context_lens,
                self.query_lens, self.scale)


def shuffled_block_tables(
    context_lens: list[int], page: int, num_blocks: int, gen: torch.Generator
) -> torch.Tensor:
    """Block tables over distinct, scattered blocks (never block 0, kept as the padding block)
    so that a kernel reading pages in the wrong order, or contiguously, gets caught."""
    need = [(c + page - 1) // page for c in context_lens]
    maxb = max(1, *need)
    ids = torch.randperm(num_blocks - 1, generator=gen)[: sum(need)] + 1
    table = torch.zeros(len(context_lens), maxb, dtype=torch.int32)
    start = 0
    for i, n in enumerate(need):
        table[i, :n] = ids[start : start + n]
        start += n
    return table


def make_paged_batch(
    context_lens: list[int],
    query_lens: list[int],
    *,
    heads: int = 4,
    kv_heads: int = 2,
    head_dim: int = 16,
    page: int = 4,
    num_q: int | None = None,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
) -> PagedBatch:
    """Random q and caches; the pool holds spare blocks so tables are non-contiguous."""
    gen = torch.Generator().manual_seed(seed)
    needed = sum((c + page - 1) // page for c in context_lens)
    num_blocks = 2 * needed + 3
    nq = num_q if num_q is not None else max(query_lens)
    shape = (num_blocks, page, kv_heads, head_dim)
    return PagedBatch(
        q=torch.randn(len(context_lens), nq, heads, head_dim, generator=gen).to(dtype),
        k_cache=torch.randn(shape, generator=gen).to(dtype),
        v_cache=torch.randn(shape, generator=gen).to(dtype),
        block_tables=shuffled_block_tables(context_lens, page, num_blocks, gen),
        context_lens=torch.tensor(context_lens),
        query_lens=torch.tensor(query_lens),
        scale=head_dim**-0.5,
    )
