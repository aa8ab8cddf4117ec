"""The torch paged-KV ops against element-by-element loops over the documented layout."""

from __future__ import annotations

import torch
from paged_inputs import shuffled_block_tables

from nj_kernels import kv_ops

BLOCKS, PAGE, KV_HEADS, HEAD_DIM = 10, 4, 2, 8


def make_cache(seed: int = 0) -> torch.Tensor:
    return torch.randn(BLOCKS, PAGE, KV_HEADS, HEAD_DIM, generator=torch.Generator().manual_seed(seed))


def test_write_kv_puts_row_t_at_slot_t() -> None:
    k_cache, v_cache = make_cache(0), make_cache(1)
    want_k, want_v = k_cache.clone(), v_cache.clone()
    k, v = torch.randn(5, KV_HEADS, HEAD_DIM), torch.randn(5, KV_HEADS, HEAD_DIM)
    slots = torch.tensor([3, 4, 17, 0, 39])
    kv_ops.write_kv(k_cache, v_cache, k, v, slots)
    for t, slot in enumerate(slots.tolist()):
        want_k[slot // PAGE, slot % PAGE] = k[t]
        want_v[slot // PAGE, slot % PAGE] = v[t]
    assert torch.equal(k_cache, want_k) and torch.equal(v_cache, want_v)


def test_slot_index_walks_the_block_table() -> None:
    table = torch.tensor([[7, 2, 5], [1, 0, 0]], dtype=torch.int32)
    idx = kv_ops.slot_index(table, PAGE, 10)
    for b in range(2):
        for pos in range(10):
            assert idx[b, pos] == int(table[b, pos // PAGE]) * PAGE + pos % PAGE


def test_gather_kv_reads_pages_in_table_order() -> None:
    cache = make_cache(2)
    table = shuffled_block_tables([9, 5], PAGE, BLOCKS, torch.Generator().manual_seed(3))
    out = kv_ops.gather_kv(cache, table, 9)
    assert out.shape == (2, 9, KV_HEADS, HEAD_DIM)
    for b, length in enumerate([9, 5]):
        for pos in range(length):
            assert torch.equal(out[b, pos], cache[int(table[b, pos // PAGE]), pos % PAGE])


def test_copy_blocks_copies_every_layer_keys_and_values() -> None:
    pool = torch.randn(3, 2, BLOCKS, PAGE, KV_HEADS, HEAD_DIM)
    original = pool.clone()
    kv_ops.copy_blocks(pool, torch.tensor([8, 5]), torch.tensor([1, 2]))
    want = original.clone()
    for layer in range(3):
        for which in range(2):
            want[layer, which, 1] = original[layer, which, 8]
            want[layer, which, 2] = original[layer, which, 5]
    assert torch.equal(pool, want)
