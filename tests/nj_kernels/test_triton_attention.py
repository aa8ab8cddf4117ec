"""The Triton paged-attention kernel against the torch path, through Triton's interpreter."""

from __future__ import annotations

import pytest
import torch
from paged_inputs import PagedBatch, make_paged_batch

from nj_kernels import triton_attention
from nj_kernels.paged_attention import paged_attention_torch


def assert_valid_rows_close(batch: PagedBatch, out: torch.Tensor, ref: torch.Tensor, atol: float) -> None:
    assert out.shape == batch.q.shape and out.dtype == batch.q.dtype
    for b, ql in enumerate(batch.query_lens.tolist()):
        torch.testing.assert_close(out[b, :ql].float(), ref[b, :ql].float(), atol=atol, rtol=0)


def check(
    batch: PagedBatch, atol: float = 1e-5, block_m: int | None = None, block_n: int | None = None
) -> torch.Tensor:
    out = triton_attention.paged_attention(*batch.args(), block_m=block_m, block_n=block_n)
    assert_valid_rows_close(batch, out, paged_attention_torch(*batch.args()), atol)
    return out


def test_available_under_interpreter() -> None:
    assert triton_attention.AVAILABLE


# Contexts are ragged and end mid-page, at a page edge, and at 1; tables are scattered.
@pytest.mark.parametrize("heads,kv_heads", [(4, 2), (6, 2), (2, 2)], ids=["gqa2", "gqa3", "mha"])
def test_decode(heads: int, kv_heads: int) -> None:
    batch = make_paged_batch([1, 6, 16, 23], [1, 1, 1, 1], heads=heads, kv_heads=kv_heads)
    check(batch, block_n=16)


@pytest.mark.parametrize("gamma_plus_one", [3, 5])
def test_speculative_verify(gamma_plus_one: int) -> None:
    ctx = [gamma_plus_one, 14, 27]
    batch = make_paged_batch(ctx, [gamma_plus_one] * 3, heads=6, kv_heads=2, seed=gamma_plus_one)
    check(batch, block_n=16)


def test_verify_with_padded_rows_writes_zeros() -> None:
    """Sequences verifying fewer rows than Q: their padding rows come out as zeros."""
    batch = make_paged_batch([9, 13, 4], [5, 2, 0], num_q=5)
    batch.context_lens[2] = 4  # a sequence with no rows this step, only cached context
    out = check(batch, block_n=16)
    assert torch.all(out[1, 2:] == 0) and torch.all(out[2] == 0)


def test_prefill_chunks_across_query_tiles() -> None:
    """A first chunk and a later chunk of different lengths; block_m=16 over 24 rows × 2
    heads per group gives three query tiles, each with its own causal key range."""
    batch = make_paged_batch([24, 37], [24, 13], heads=4, kv_heads=2, page=8, seed=3)
    check(batch, block_m=16, block_n=16)


def test_default_tiles() -> None:
    batch = make_paged_batch([30, 70], [9, 1], heads=6, kv_heads=2, page=16, seed=5)
    check(batch)


def test_head_dim_not_power_of_two() -> None:
    batch = make_paged_batch([11, 5], [3, 3], heads=4, kv_heads=1, head_dim=24, seed=7)
    check(batch, block_n=16)


def test_strided_views_as_the_engine_passes_them() -> None:
    """q sliced out of a fused qkv projection, caches as views into a layered pool."""
    base = make_paged_batch([10, 19], [3, 3], heads=4, kv_heads=2, seed=11)
    b, nq, h, d = base.q.shape
    qkv = torch.randn(b, nq, h + 4, d)
    qkv[:, :, :h] = base.q
    pool = torch.randn(2, 2, *base.k_cache.shape)
    pool[1, 0], pool[1, 1] = base.k_cache, base.v_cache
    view = PagedBatch(qkv[:, :, :h], pool[1, 0], pool[1, 1], base.block_tables,
                      base.context_lens, base.query_lens, base.scale)
    assert not view.q.is_contiguous()
    out = triton_attention.paged_attention(*view.args(), block_n=16)
    assert_valid_rows_close(view, out, paged_attention_torch(*base.args()), atol=1e-5)


@pytest.mark.parametrize(("dtype", "atol"), [(torch.float16, 5e-3), (torch.bfloat16, 3e-2)])
def test_low_precision(dtype: torch.dtype, atol: float) -> None:
    """fp16/bf16 in, fp32 accumulation; probabilities are rounded to the input dtype before
    the value product (as in flash attention), hence the looser tolerance."""
    batch = make_paged_batch([12, 25], [5, 1], heads=6, kv_heads=2, dtype=dtype, seed=13)
    check(batch, atol=atol, block_n=16)


def test_rejects_heads_not_a_multiple_of_kv_heads() -> None:
    batch = make_paged_batch([4], [1], heads=3, kv_heads=2)
    with pytest.raises(ValueError, match="bad shapes"):
        triton_attention.paged_attention(*batch.args())
