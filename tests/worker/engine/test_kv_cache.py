"""KVCache sizing from a memory budget, block copies, and resizing with evacuation moves."""

from __future__ import annotations

import pytest
import torch

from worker.engine.block_manager import BlockManager
from worker.engine.kv_cache import KVCache, blocks_for_budget, bytes_per_block
from worker.engine.model_config import ModelConfig

CONFIG = ModelConfig(
    model_type="llama",
    vocab_size=10,
    hidden_size=8,
    intermediate_size=16,
    num_layers=2,
    num_heads=2,
    num_kv_heads=1,
    head_dim=4,
    rms_norm_eps=1e-6,
    max_position_embeddings=64,
    tie_word_embeddings=False,
)


def test_budget_gives_blocks_after_weights() -> None:
    per_block = bytes_per_block(CONFIG, 4, torch.float32)
    assert per_block == 2 * 2 * 4 * 1 * 4 * 4
    assert blocks_for_budget(CONFIG, 4, torch.float32, 1000 + 10 * per_block + 5, 1000) == 10
    with pytest.raises(ValueError, match="not even one KV block"):
        blocks_for_budget(CONFIG, 4, torch.float32, 1000, 1000)


def test_shrink_keeps_live_contents_and_grow_keeps_everything() -> None:
    bm = BlockManager(8, 4)
    cache = KVCache(CONFIG, 8, 4, torch.device("cpu"), torch.float32)
    cache.kv.copy_(torch.randn(cache.kv.shape))
    assert bm.allocate("filler", 0, 16)
    assert bm.allocate("live", 0, 12)  # blocks 4, 5, 6
    bm.free("filler")
    before = cache.kv[:, :, bm.table("live")].clone()
    moves = bm.resize(4)
    cache.resize(4, moves)
    assert cache.num_blocks == 4 and all(b < 4 for b in bm.table("live"))
    assert torch.equal(cache.kv[:, :, bm.table("live")], before)
    cache.resize(9, bm.resize(9))
    assert cache.num_blocks == 9
    assert torch.equal(cache.kv[:, :, bm.table("live")], before)
    assert cache.nbytes == 9 * bytes_per_block(CONFIG, 4, torch.float32)


def test_copy_blocks_for_copy_on_write() -> None:
    cache = KVCache(CONFIG, 4, 4, torch.device("cpu"), torch.float32)
    cache.kv.copy_(torch.randn(cache.kv.shape))
    src = cache.kv[:, :, 1].clone()
    cache.copy([(1, 3)])
    assert torch.equal(cache.kv[:, :, 3], src)
