"""Paged KV cache operations: write new keys/values, gather a sequence's pages, copy blocks.

Layout (shared by the engine, the drafters and every kernel):
- ``kv``: one tensor per model, ``[num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim]``;
  ``kv[l, 0]`` is layer l's key cache, ``kv[l, 1]`` its value cache.
- a *slot* is ``block_id * block_size + offset``; a block table row lists a sequence's block ids
  in order (padded with 0).

Each function has a torch path (the CPU path, and the reference) and dispatches to Triton
on CUDA tensors when the Triton kernels are available.
"""

from __future__ import annotations

import torch


def write_kv_torch(
    k_cache: torch.Tensor,  # [NB, BS, KVH, D]
    v_cache: torch.Tensor,  # [NB, BS, KVH, D]
    k: torch.Tensor,  # [T, KVH, D]
    v: torch.Tensor,  # [T, KVH, D]
    slots: torch.Tensor,  # [T] int64
) -> None:
    """Write T new key/value rows into their slots, in place."""
    kvh, d = k_cache.shape[-2:]
    k_cache.view(-1, kvh, d).index_copy_(0, slots, k.to(k_cache.dtype))
    v_cache.view(-1, kvh, d).index_copy_(0, slots, v.to(v_cache.dtype))


def write_kv(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    slots: torch.Tensor,
) -> None:
    if k_cache.is_cuda:
        from nj_kernels import triton_kv

        if triton_kv.AVAILABLE:
            triton_kv.write_kv(k_cache, v_cache, k, v, slots)
            return
    write_kv_torch(k_cache, v_cache, k, v, slots)


def slot_index(block_tables: torch.Tensor, block_size: int, max_len: int) -> torch.Tensor:
    """``[B, max_len]`` slot of each position of each sequence (positions past a table's end map
    to whatever its padding block holds: callers mask them)."""
    nblk = (max_len + block_size - 1) // block_size
    offs = torch.arange(block_size, device=block_tables.device, dtype=torch.long)
    idx = block_tables[:, :nblk].long().unsqueeze(-1) * block_size + offs
    return idx.reshape(block_tables.shape[0], -1)[:, :max_len]


def gather_kv_torch(cache: torch.Tensor, block_tables: torch.Tensor, max_len: int) -> torch.Tensor:
    """``[B, max_len, KVH, D]``: each sequence's first ``max_len`` cached rows, in order."""
    nb, bs, kvh, d = cache.shape
    idx = slot_index(block_tables, bs, max_len)
    return cache.view(nb * bs, kvh, d)[idx]


def gather_kv(cache: torch.Tensor, block_tables: torch.Tensor, max_len: int) -> torch.Tensor:
    if cache.is_cuda:
        from nj_kernels import triton_kv

        if triton_kv.AVAILABLE:
            return triton_kv.gather_kv(cache, block_tables, max_len)
    return gather_kv_torch(cache, block_tables, max_len)


def copy_blocks_torch(kv: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> None:
    """Copy whole blocks ``src[i] -> dst[i]`` in every layer, keys and values, in place.
    Sources and destinations must not overlap (compaction moves live blocks into free ones)."""
    if src.numel() == 0:
        return
    kv[:, :, dst.long()] = kv[:, :, src.long()]


def copy_blocks(kv: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> None:
    if kv.is_cuda:
        from nj_kernels import triton_kv

        if triton_kv.AVAILABLE:
            triton_kv.copy_blocks(kv, src, dst)
            return
    copy_blocks_torch(kv, src, dst)
