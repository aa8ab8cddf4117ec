"""Attention of one step's query rows over the paged KV cache, planned once per step.

The batch is split into groups of sequences with the same number of query rows (decode rows
with decode rows, a verify of γ+1 rows with others of γ+1, each prefill chunk alone), so a
decode row is never padded to a long prefill chunk. Everything that depends only on the batch
(block lists, masks) is built once per step in ``AttentionGroup`` and reused by every layer.

On CUDA the group calls ``nj_kernels.paged_attention.paged_attention`` (Triton). A group planned
``invariant`` (a model served from GGUF blocks) runs ``nj_kernels.cpu_attention``: each row by
itself, so its output does not depend on the rows around it. Otherwise the CPU path
gathers whole pages with one ``index_select`` over the layer's joint key/value tensor (pages
are contiguous, so this copies large runs instead of single rows) and runs SDPA with the
query heads of each KV head stacked as rows, which avoids expanding keys and values. A
forward of few fp32 CPU rows (any forward of a model of GGUF blocks) runs neither: the fused
decode path (``nj_kernels/cpu_decode.py``) reads each row's pages in place through its group's
block tables.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch
import torch.nn.functional as F

from nj_kernels.cpu_attention import paged_attention_rows
from nj_kernels.paged_attention import paged_attention


@dataclass
class AttentionGroup:
    """``num_seqs`` sequences with ``num_queries`` rows each, rows ``row_start`` onwards of
    the flattened batch. What only the torch CPU path reads (the pages to gather, the mask) is
    built on its first use, so the fused C path (which reads the tables) never pays for it."""

    row_start: int
    num_seqs: int
    num_queries: int
    block_tables: torch.Tensor  # [B, MAXB] int32
    context_lens: torch.Tensor  # [B] int32: cached tokens including this step's rows
    query_lens: torch.Tensor  # [B] int32
    block_size: int
    group_size: int  # query heads per KV head
    dtype: torch.dtype
    invariant: bool = False  # CPU: the row-invariant kernel (nj_kernels.cpu_attention)

    @property
    def num_rows(self) -> int:
        return self.num_seqs * self.num_queries

    @cached_property
    def block_ids(self) -> torch.Tensor:
        """``[B * pages]`` int64: the pages to gather on the torch path."""
        return self.block_tables.flatten().long()

    @cached_property
    def mask(self) -> torch.Tensor:
        """``[B, 1, Q * G, pages * block_size]`` additive, rows ordered (query, head); empty on
        CUDA, where the kernel masks by itself."""
        device = self.block_tables.device
        if device.type == "cuda":
            return torch.empty(0, device=device)
        b, nq, g = self.num_seqs, self.num_queries, self.group_size
        key_pos = torch.arange(self.block_tables.shape[1] * self.block_size, device=device)
        q_pos = (self.context_lens - nq).unsqueeze(1) + torch.arange(nq, device=device)  # [B, Q]
        visible = key_pos.view(1, 1, -1) <= q_pos.unsqueeze(-1)  # causal; hides padded pages
        # Additive, so SDPA does not convert a boolean mask again in every layer.
        mask = torch.zeros(visible.shape, device=device, dtype=self.dtype).masked_fill_(
            ~visible, float("-inf")
        )
        return mask.unsqueeze(2).expand(b, nq, g, -1).reshape(b, 1, -1, visible.shape[-1])


def plan_group(
    row_start: int,
    num_queries: int,
    tables: list[list[int]],
    context_lens: list[int],
    block_size: int,
    group_size: int,
    device: torch.device,
    dtype: torch.dtype,
    invariant: bool = False,
) -> AttentionGroup:
    """Plan attention for sequences that each send ``num_queries`` rows ending at their
    context length. ``group_size`` is query heads per KV head; ``invariant`` (CPU): every row
    attended by itself (``nj_kernels.cpu_attention``)."""
    b = len(tables)
    pages = (max(context_lens) + block_size - 1) // block_size
    padded = [t[:pages] + [0] * (pages - len(t[:pages])) for t in tables]
    return AttentionGroup(
        row_start=row_start,
        num_seqs=b,
        num_queries=num_queries,
        block_tables=torch.tensor(padded, dtype=torch.int32, device=device),
        context_lens=torch.tensor(context_lens, dtype=torch.int32, device=device),
        query_lens=torch.full((b,), num_queries, dtype=torch.int32, device=device),
        block_size=block_size,
        group_size=group_size,
        dtype=dtype,
        invariant=invariant and device.type == "cpu",
    )


def group_attention(
    q: torch.Tensor,  # [B * Q, H, D] rows of this group
    kv_layer: torch.Tensor,  # [2, NB, BS, KVH, D]
    group: AttentionGroup,
    scale: float,
) -> torch.Tensor:
    """Causal attention for one group; returns ``[B * Q, H, D]``."""
    b, nq = group.num_seqs, group.num_queries
    _, h, d = q.shape
    if q.is_cuda:
        out = paged_attention(
            q.view(b, nq, h, d),
            kv_layer[0],
            kv_layer[1],
            group.block_tables,
            group.context_lens,
            group.query_lens,
            scale,
        )
        return out.reshape(b * nq, h, d)
    if group.invariant:
        return paged_attention_rows(q, kv_layer, group.block_tables, group.context_lens, nq, scale)
    kvh = kv_layer.shape[3]
    g = h // kvh
    pages = kv_layer.index_select(1, group.block_ids).view(2, b, -1, kvh, d)
    k, v = pages[0].transpose(1, 2), pages[1].transpose(1, 2)  # [B, KVH, L, D]
    # Query head j uses KV head j // g (transformers' repeat_kv order), so heads of a KV
    # group are consecutive: stack them as extra query rows (a plain view for decode rows).
    if nq == 1:
        out = F.scaled_dot_product_attention(q.view(b, kvh, g, d), k, v, attn_mask=group.mask, scale=scale)
        return out.view(b, h, d)
    qg = q.view(b, nq, kvh, g, d).permute(0, 2, 1, 3, 4).reshape(b, kvh, nq * g, d)
    out = F.scaled_dot_product_attention(qg, k, v, attn_mask=group.mask, scale=scale)
    return out.view(b, kvh, nq, g, d).permute(0, 2, 1, 3, 4).reshape(b * nq, h, d)
