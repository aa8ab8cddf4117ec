"""BlockManager: tables, exact prefix reuse, copy-on-write, truncate, resize, integrity."""

from __future__ import annotations

import pytest

from worker.engine.block_manager import BlockManager

BS = 4


def computed(bm: BlockManager, seq: str, tokens: list[int], prompt_done: bool = True) -> None:
    """Allocate and 'compute' all of ``tokens`` for ``seq`` the way the engine does."""
    assert bm.allocate(seq, 0, len(tokens))
    bm.take_copies()
    bm.commit(seq, tokens, len(tokens))
    if prompt_done:
        bm.cache_tail(seq, tokens)


def test_allocate_and_free_reference_counts() -> None:
    bm = BlockManager(8, BS)
    assert bm.allocate("a", 0, 10)
    assert len(bm.table("a")) == 3 and bm.num_free_blocks == 5
    assert bm.allocate("a", 10, 13)  # crosses into a 4th block
    assert len(bm.table("a")) == 4
    assert not bm.allocate("b", 0, 4 * BS + 1)  # 5 blocks > 4 free: no change
    assert bm.table("b") == [] and bm.num_free_blocks == 4
    bm.free("a")
    assert bm.num_free_blocks == 8


def test_full_block_prefix_hit_is_shared_and_counted() -> None:
    bm = BlockManager(16, BS)
    prompt = list(range(10))
    computed(bm, "a", prompt)
    other = [*prompt[:8], 99, 98]
    assert bm.match_prefix("b", other) == 8  # two full blocks
    assert bm.table("b") == bm.table("a")[:2]
    assert all(bm.pool.blocks[b].ref_count == 2 for b in bm.table("b"))
    assert (bm.prefix_queries, bm.prefix_hits) == (10, 8)


def test_exact_repeat_matches_the_partial_tail_and_copies_on_write() -> None:
    bm = BlockManager(16, BS)
    prompt = list(range(10))
    computed(bm, "a", prompt)
    tail = bm.table("a")[2]
    assert bm.match_prefix("b", prompt) == 10
    assert bm.table("b")[2] == tail
    # b writes position 10, inside the shared frozen tail block: it must get its own copy.
    assert bm.blocks_needed("b", 10, 11) == 1
    assert bm.allocate("b", 10, 11)
    new = bm.table("b")[2]
    assert new != tail
    assert bm.pool.blocks[tail].ref_count == 2  # source pinned until the copy is taken
    assert bm.take_copies() == [(tail, new)]
    assert bm.pool.blocks[tail].ref_count == 1
    # a writes on too: its own tail is frozen (cached for repeats), so it copies as well.
    assert bm.allocate("a", 10, 11)
    assert bm.table("a")[2] not in (tail, new)
    assert len(bm.take_copies()) == 1
    assert bm.pool.blocks[tail].ref_count == 0 and bm.pool.blocks[tail].frozen  # still reusable
    assert bm.match_prefix("c", prompt) == 10


def test_partial_tail_is_a_prefix_of_a_longer_prompt() -> None:
    bm = BlockManager(16, BS)
    computed(bm, "a", list(range(6)))  # blocks: [0..3], [4, 5]
    assert bm.match_prefix("b", [0, 1, 2, 3, 4, 5, 6, 7, 8]) == 6


def test_forced_hash_collisions_never_give_a_wrong_hit() -> None:
    bm = BlockManager(16, BS, hash_fn=lambda parent, tokens: 0)
    computed(bm, "a", [1, 2, 3, 4, 5, 6, 7, 8])
    assert bm.match_prefix("b", [9, 9, 9, 9, 5, 6, 7, 8]) == 0
    assert bm.match_prefix("c", [1, 2, 3, 4, 5, 6, 7, 8]) == 4  # the registered block only
    # Same second-block tokens under a different first block: confirmed false by the parent.
    computed(bm, "d", [1, 2, 3, 4, 9, 9, 9, 9])
    assert bm.match_prefix("e", [1, 2, 3, 4, 9, 9, 9, 9]) == 4


def test_lru_eviction_only_when_blocks_are_needed() -> None:
    bm = BlockManager(4, BS)
    computed(bm, "a", list(range(8)))
    bm.free("a")
    assert bm.num_free_blocks == 4  # cached blocks count as free
    assert bm.match_prefix("b", list(range(8))) == 8
    bm.free("b")
    assert bm.allocate("c", 0, 8)  # takes the two empty blocks first
    assert bm.match_prefix("d", list(range(8))) == 8
    bm.free("d")
    bm.free("c")
    assert bm.allocate("e", 0, 16)  # needs all four: the cache is evicted
    assert bm.match_prefix("f", list(range(8))) == 0


def test_truncate_frees_the_tail_and_rewrites_in_place() -> None:
    bm = BlockManager(8, BS)
    tokens = list(range(6))
    computed(bm, "a", tokens, prompt_done=False)
    assert bm.allocate("a", 6, 11)  # 5 speculative rows: up to 3 blocks
    assert len(bm.table("a")) == 3
    bm.truncate("a", 7)  # keep one accepted row
    assert len(bm.table("a")) == 2 and bm.num_free_blocks == 6
    assert bm.allocate("a", 7, 8)
    assert bm.take_copies() == []


def test_truncate_into_a_frozen_block_copies_on_the_next_write() -> None:
    bm = BlockManager(8, BS)
    tokens = list(range(8))
    computed(bm, "a", tokens)
    frozen = bm.table("a")[1]
    bm.truncate("a", 6)
    assert bm.allocate("a", 6, 7)
    assert bm.table("a")[1] != frozen and len(bm.take_copies()) == 1
    assert bm.match_prefix("b", tokens) == 8  # the cached content was not touched


def test_freed_copy_destination_drops_the_pending_copy() -> None:
    bm = BlockManager(8, BS)
    computed(bm, "a", list(range(6)))
    assert bm.match_prefix("b", list(range(6))) == 6
    assert bm.allocate("b", 6, 7)
    bm.free("b")
    assert bm.take_copies() == []


def test_resize_moves_live_blocks_and_remaps_tables() -> None:
    bm = BlockManager(8, BS)
    assert bm.allocate("x", 0, 4 * BS)  # blocks 0..3
    assert bm.allocate("a", 0, 2 * BS)  # blocks 4, 5
    bm.free("x")
    contents = list(range(8))
    bm.commit("a", contents, 8)
    moves = bm.resize(4)
    assert len(moves) == 2 and all(dst < 4 for _, dst in moves)
    assert bm.table("a") == [dst for _, dst in moves]
    assert bm.num_blocks == 4 and bm.num_free_blocks == 2
    bm.free("a")
    assert bm.match_prefix("b", contents) == 8  # registrations followed the move
    assert bm.resize(10) == [] and bm.num_free_blocks == 10 - 2


def test_resize_refuses_when_live_blocks_exceed_the_new_size() -> None:
    bm = BlockManager(8, BS)
    assert bm.allocate("a", 0, 6 * BS)
    with pytest.raises(ValueError):
        bm.resize(4)
    assert bm.num_blocks == 8 and len(bm.table("a")) == 6


def test_copy_of_a_frozen_block_ends_the_frozen_prefix() -> None:
    """An exact repeat of a block-aligned prompt recomputes its last token into a private copy
    of the last frozen block; the next block must then chain to that copy, not be frozen as if
    it had no parent (which made its KV findable as the *first* block of other prompts)."""
    bm = BlockManager(16, BS)
    prompt = list(range(8))
    computed(bm, "a", prompt)
    bm.free("a")
    assert bm.match_prefix("b", prompt) == 8
    assert bm.allocate("b", 7, 12)  # rewrite position 7 (copy of block 1), then 8..11
    bm.take_copies()
    tokens = [*prompt, 20, 21, 22, 23]
    bm.commit("b", tokens, 12)
    bm.check_integrity()
    assert bm.match_prefix("c", [20, 21, 22, 23, 5]) == 0  # block 2's tokens are not a first block


def test_check_integrity_catches_unbalanced_books() -> None:
    bm = BlockManager(8, BS)
    computed(bm, "a", list(range(6)))
    bm.check_integrity()
    bm.pool.blocks[bm.table("a")[0]].ref_count += 1
    with pytest.raises(AssertionError, match="ref_count"):
        bm.check_integrity()
