"""The Triton KV kernels against the torch paths, through Triton's interpreter."""

from __future__ import annotations

import pytest
import torch
from paged_inputs import shuffled_block_tables

from nj_kernels import kv_ops, triton_kv

LAYERS, BLOCKS, PAGE, KV_HEADS, HEAD_DIM = 2, 12, 4, 2, 8


def make_pool(dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(LAYERS, 2, BLOCKS, PAGE, KV_HEADS, HEAD_DIM, generator=gen).to(dtype)


def test_available_under_interpreter() -> None:
    assert triton_kv.AVAILABLE


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_write_kv_matches_torch(cache_dtype: torch.dtype) -> None:
    """Scattered slots across pages, into views of one layer of the pool; rows arrive in fp32
    and are cast to the cache dtype."""
    gen = torch.Generator().manual_seed(1)
    k = torch.randn(6, KV_HEADS, HEAD_DIM, generator=gen)
    v = torch.randn(6, KV_HEADS, HEAD_DIM, generator=gen)
    slots = torch.tensor([0, 5, 13, 14, 31, 47])
    got, want = make_pool(cache_dtype), make_pool(cache_dtype)
    triton_kv.write_kv(got[1, 0], got[1, 1], k, v, slots)
    kv_ops.write_kv_torch(want[1, 0], want[1, 1], k, v, slots)
    assert torch.equal(got, want)


def test_write_kv_strided_rows() -> None:
    """k and v sliced out of one fused projection output."""
    kv_rows = torch.randn(3, 2 * KV_HEADS, HEAD_DIM)
    k, v = kv_rows[:, :KV_HEADS], kv_rows[:, KV_HEADS:]
    slots = torch.tensor([7, 8, 2])
    got, want = make_pool(), make_pool()
    triton_kv.write_kv(got[0, 0], got[0, 1], k, v, slots)
    kv_ops.write_kv_torch(want[0, 0], want[0, 1], k, v, slots)
    assert torch.equal(got, want)


def test_write_kv_drops_negative_slots() -> None:
    k = torch.ones(2, KV_HEADS, HEAD_DIM)
    pool = make_pool()
    before = pool.clone()
    triton_kv.write_kv(pool[0, 0], pool[0, 1], k, k, torch.tensor([-1, 9]))
    kv_ops.write_kv_torch(before[0, 0], before[0, 1], k[1:], k[1:], torch.tensor([9]))
    assert torch.equal(pool, before)


@pytest.mark.parametrize("max_len", [1, 10, 17, 40], ids=lambda n: f"len{n}")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gather_kv_matches_torch(max_len: int, dtype: torch.dtype) -> None:
    """Ragged tables over scattered blocks; 40 asks for more than the tables address (both
    paths cap at 5 pages = 20 rows)."""
    gen = torch.Generator().manual_seed(2)
    tables = shuffled_block_tables([17, 6, 12], PAGE, BLOCKS, gen)
    cache = make_pool(dtype)[1, 1]
    got = triton_kv.gather_kv(cache, tables, max_len)
    want = kv_ops.gather_kv_torch(cache, tables, max_len)
    assert got.shape == want.shape and torch.equal(got, want)


def test_gather_kv_strided_cache() -> None:
    """A cache whose pages are not laid out densely (every other block of a bigger pool)."""
    cache = make_pool()[0, 0, ::2]
    tables = torch.tensor([[3, 1], [5, 0]], dtype=torch.int32)
    got = triton_kv.gather_kv(cache, tables, 7)
    assert torch.equal(got, kv_ops.gather_kv_torch(cache.contiguous(), tables, 7))


@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
def test_copy_blocks_matches_torch(index_dtype: torch.dtype) -> None:
    src = torch.tensor([9, 2, 7], dtype=index_dtype)
    dst = torch.tensor([0, 4, 11], dtype=index_dtype)
    got, want = make_pool(), make_pool()
    triton_kv.copy_blocks(got, src, dst)
    kv_ops.copy_blocks_torch(want, src, dst)
    assert torch.equal(got, want)


def test_copy_blocks_moves_whole_blocks_and_nothing_else() -> None:
    original = make_pool(torch.float16, seed=3)
    pool = original.clone()
    src, dst = torch.tensor([10, 3]), torch.tensor([1, 6])
    triton_kv.copy_blocks(pool, src, dst)
    assert torch.equal(pool[:, :, dst], original[:, :, src])
    untouched = [i for i in range(BLOCKS) if i not in dst.tolist()]
    assert torch.equal(pool[:, :, untouched], original[:, :, untouched])


def test_copy_blocks_with_nothing_to_move() -> None:
    pool = make_pool()
    before = pool.clone()
    empty = torch.empty(0, dtype=torch.long)
    triton_kv.copy_blocks(pool, empty, empty)
    assert torch.equal(pool, before)
