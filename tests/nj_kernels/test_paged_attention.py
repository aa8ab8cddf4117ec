"""The torch paged-attention path against dense attention written out by hand."""

from __future__ import annotations

import pytest
import torch
from paged_inputs import PagedBatch, make_paged_batch

from nj_kernels.paged_attention import paged_attention, paged_attention_torch


def naive_attention(batch: PagedBatch) -> list[torch.Tensor]:
    """Per sequence, in float64: read the pages position by position, then softmax under an
    explicit causal mask. Returns each sequence's valid rows, ``[query_len, H, D]``."""
    page, kvh = batch.k_cache.shape[1], batch.k_cache.shape[2]
    heads = batch.q.shape[2]
    outs = []
    for b in range(batch.q.shape[0]):
        ctx, ql = int(batch.context_lens[b]), int(batch.query_lens[b])
        blocks = [int(batch.block_tables[b, p // page]) for p in range(ctx)]
        keys = torch.stack([batch.k_cache[blk, p % page] for p, blk in enumerate(blocks)]).double()
        vals = torch.stack([batch.v_cache[blk, p % page] for p, blk in enumerate(blocks)]).double()
        keys = keys.repeat_interleave(heads // kvh, dim=1)  # [ctx, H, D]: head h reads kv head h // G
        vals = vals.repeat_interleave(heads // kvh, dim=1)
        q = batch.q[b, :ql].double()  # [ql, H, D]
        scores = torch.einsum("jhd,khd->hjk", q, keys) * batch.scale
        q_pos = torch.arange(ctx - ql, ctx).view(-1, 1)
        causal = torch.arange(ctx).view(1, -1) <= q_pos  # [ql, ctx]
        scores = scores.masked_fill(~causal, float("-inf"))
        outs.append(torch.einsum("hjk,khd->jhd", scores.softmax(-1), vals))
    return outs


def assert_matches_naive(batch: PagedBatch, out: torch.Tensor, atol: float) -> None:
    for b, ref in enumerate(naive_attention(batch)):
        torch.testing.assert_close(out[b, : ref.shape[0]].double(), ref, atol=atol, rtol=0)


CASES = {
    "decode": ([1, 6, 13, 16], [1, 1, 1, 1]),
    "verify3": ([3, 9, 20], [3, 3, 3]),
    "verify5_padded": ([5, 17, 11], [5, 2, 5]),
    "prefill_first_chunk": ([24, 19], [24, 19]),
    "prefill_later_chunk": ([40, 29], [16, 8]),
}


@pytest.mark.parametrize("heads,kv_heads", [(4, 2), (6, 2), (3, 3)], ids=["gqa2", "gqa3", "mha"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_torch_path_matches_naive(
    case: str, heads: int, kv_heads: int
) -> None:
    ctx, ql = CASES[case]
    batch = make_paged_batch(ctx, ql, heads=heads, kv_heads=kv_heads, seed=len(case))
    assert_matches_naive(batch, paged_attention_torch(*batch.args()), atol=1e-5)


def test_torch_path_honours_max_context() -> None:
    """A max_context hint past the longest sequence (within what the tables address) must not
    change anything."""
    batch = make_paged_batch([7, 10], [2, 4], page=4)
    b = batch
    out = paged_attention_torch(
        b.q, b.k_cache, b.v_cache, b.block_tables, b.context_lens, b.query_lens, b.scale, max_context=12
    )
    assert_matches_naive(batch, out, atol=1e-5)


def test_cpu_dispatch_is_the_torch_path() -> None:
    batch = make_paged_batch([9, 14], [3, 3])
    assert torch.equal(paged_attention(*batch.args()), paged_attention_torch(*batch.args()))


def test_torch_path_low_precision_matches_naive() -> None:
    batch = make_paged_batch([10, 21], [4, 1], dtype=torch.bfloat16)
    assert_matches_naive(batch, paged_attention_torch(*batch.args()), atol=3e-2)
