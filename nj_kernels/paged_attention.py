"""Attention of a batch of query rows over a paged KV cache.

One call serves decode (1 query row per sequence), speculative verification (γ+1 rows)
and chunked prefill (a chunk of rows). Query row j of sequence b sits at position
``context_lens[b] - query_lens[b] + j``; its keys/values are already written to the cache.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from nj_kernels.kv_ops import gather_kv_torch


def paged_attention_torch(
    q: torch.Tensor,  # [B, Q, H, D]
    k_cache: torch.Tensor,  # [NB, BS, KVH, D]
    v_cache: torch.Tensor,  # [NB, BS, KVH, D]
    block_tables: torch.Tensor,  # [B, MAXB] int32
    context_lens: torch.Tensor,  # [B] int: cached tokens including this step's rows
    query_lens: torch.Tensor,  # [B] int: valid rows of q (≤ Q)
    scale: float,
    max_context: int | None = None,
) -> torch.Tensor:
    """Causal attention; returns ``[B, Q, H, D]`` (rows past a sequence's query_len are junk)."""
    nq, h = q.shape[1], q.shape[2]
    kvh = k_cache.shape[2]
    lmax = int(max_context if max_context is not None else int(context_lens.max()))
    k = gather_kv_torch(k_cache, block_tables, lmax).transpose(1, 2)  # [B, KVH, L, D]
    v = gather_kv_torch(v_cache, block_tables, lmax).transpose(1, 2)
    key_pos = torch.arange(lmax, device=q.device)
    q_pos = (context_lens - query_lens).unsqueeze(1) + torch.arange(nq, device=q.device)  # [B, Q]
    mask = (key_pos.view(1, 1, -1) <= q_pos.unsqueeze(-1)) & (
        key_pos.view(1, 1, -1) < context_lens.view(-1, 1, 1)
    )  # [B, Q, L]
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), k, v, attn_mask=mask.unsqueeze(1), scale=scale, enable_gqa=kvh != h
    )
    return out.transpose(1, 2)


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    query_lens: torch.Tensor,
    scale: float,
    max_context: int | None = None,
) -> torch.Tensor:
    """Dispatch: Triton on CUDA (when available), torch elsewhere."""
    if q.is_cuda:
        from nj_kernels import triton_attention

        if triton_attention.AVAILABLE:
            return triton_attention.paged_attention(
                q, k_cache, v_cache, block_tables, context_lens, query_lens, scale
            )
    return paged_attention_torch(
        q, k_cache, v_cache, block_tables, context_lens, query_lens, scale, max_context
    )
