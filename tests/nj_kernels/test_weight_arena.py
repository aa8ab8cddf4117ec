"""The weight arena: packed copies equal the originals, start on cache lines (the block on a
2 MiB boundary), get huge pages where the kernel grants them, and a model packed into one
computes what it computed before, its tied output layer still its embedding."""

from __future__ import annotations

import torch

from nj_kernels import weight_arena
from tests.nj_kernels.random_models import VARIANTS, make_runner
from worker.engine.model_runner import ForwardItem


def test_packed_copies_equal_the_originals_on_cache_lines() -> None:
    g = torch.Generator().manual_seed(0)
    tensors = [
        torch.randn(3, 5, generator=g),
        torch.randn(7, generator=g).double(),
        torch.arange(11),
        torch.randn(0),
    ]
    packed = weight_arena.pack(tensors)
    assert [(t.shape, t.dtype) for t in packed] == [(t.shape, t.dtype) for t in tensors]
    assert all(torch.equal(a, b) and a.is_contiguous() for a, b in zip(packed, tensors, strict=True))
    assert packed[0].data_ptr() % weight_arena.HUGE == 0
    assert all(t.data_ptr() % weight_arena.ALIGN == 0 for t in packed)
    packed[0].add_(1)  # copies, not views of the originals
    assert not torch.equal(packed[0], tensors[0])
    assert weight_arena.pack([]) == []


def test_the_arena_gets_huge_pages_where_the_kernel_grants_them() -> None:
    (big,) = weight_arena.pack([torch.ones(4 * weight_arena.HUGE // 4)])  # 4 MiB of fp32
    got = weight_arena.huge_page_bytes(big)
    if weight_arena.thp_enabled():
        assert got >= weight_arena.HUGE, "advised for huge pages, backed by 4 KiB pages"
    else:  # THP off on this kernel: the block is still aligned and in order
        assert got == 0


def test_a_packed_model_computes_what_it_did_and_keeps_its_tie() -> None:
    runner = make_runner(**VARIANTS["llama_gqa"])  # ModelRunner packs CPU weights as it builds
    model = runner.model
    assert model.lm_head is model.embed
    ptrs = [t.data_ptr() for layer in model.layers for t in vars(layer).values() if t is not None]
    assert ptrs == sorted(ptrs), "not in the order a forward reads them"
    assert ptrs[0] % weight_arena.HUGE == 0 and model.embed.data_ptr() > ptrs[-1]
    item = [ForwardItem([1, 2, 3], 0, [0], 3)]
    before, _ = runner.run(item)
    model.pack_weights()  # again, into a fresh arena
    assert model.lm_head is model.embed and model.layers[0].qkv.data_ptr() not in ptrs
    after, _ = runner.run(item)
    assert torch.equal(before, after)
