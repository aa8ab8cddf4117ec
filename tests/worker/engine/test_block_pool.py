"""BlockPool: reference counts, the free queue order, exact prefix lookup, resizing."""

from __future__ import annotations

import pytest

from worker.engine.block_pool import ROOT_UID, BlockPool


def test_take_acquire_release_counts() -> None:
    pool = BlockPool(4)
    a = pool.take()
    assert pool.blocks[a].ref_count == 1 and pool.num_free == 3
    pool.acquire(a)
    pool.release(a)
    assert pool.blocks[a].ref_count == 1 and pool.num_free == 3
    pool.release(a)
    assert pool.num_free == 4
    with pytest.raises(RuntimeError):
        pool.release(a)


def test_empty_blocks_are_taken_before_cached_ones_and_cached_ones_lru() -> None:
    pool = BlockPool(4)
    ids = [pool.take() for _ in range(4)]
    for i, bid in enumerate(ids[:2]):
        pool.freeze(bid, None, ROOT_UID, (i,))
    pool.release(ids[0])  # cached, released first: least recently used
    pool.release(ids[1])  # cached
    pool.release(ids[2])  # empty
    assert pool.take() == ids[2]
    assert pool.take() == ids[0]  # evicts the LRU cached block
    assert pool.lookup(None, ROOT_UID, (0,)) is None
    assert pool.lookup(None, ROOT_UID, (1,)) == ids[1]


def test_lookup_confirms_tokens_and_parent_on_hash_collision() -> None:
    pool = BlockPool(4, hash_fn=lambda parent, tokens: 7)  # every content collides
    a = pool.take()
    pool.freeze(a, None, ROOT_UID, (1, 2))
    b = pool.take()
    pool.freeze(b, None, ROOT_UID, (3, 4))  # same hash: stays unregistered, keeps a uid
    assert pool.blocks[b].frozen
    assert pool.lookup(None, ROOT_UID, (1, 2)) == a
    assert pool.lookup(None, ROOT_UID, (3, 4)) is None  # the hash hits a, the tokens differ
    assert pool.lookup(None, pool.blocks[b].uid, (1, 2)) is None  # tokens match, parent differs


def test_evicted_block_is_forgotten() -> None:
    pool = BlockPool(1)
    a = pool.take()
    pool.freeze(a, None, ROOT_UID, (5,))
    pool.release(a)
    assert pool.lookup(None, ROOT_UID, (5,)) == a
    assert pool.take() == a
    assert pool.lookup(None, ROOT_UID, (5,)) is None
    assert not pool.blocks[a].frozen and not pool.registry


def test_shrink_moves_live_blocks_and_keeps_their_registration() -> None:
    pool = BlockPool(6)
    ids = [pool.take() for _ in range(6)]
    for bid in ids[:3]:
        pool.release(bid)  # blocks 0..2 free
    pool.freeze(ids[4], None, ROOT_UID, (9, 9))
    pool.acquire(ids[4])  # ref 2
    moves = pool.shrink(3)
    assert sorted(src for src, _ in moves) == [3, 4, 5]
    assert all(dst < 3 for _, dst in moves)
    dst4 = dict(moves)[4]
    assert pool.blocks[dst4].ref_count == 2
    assert pool.lookup(None, ROOT_UID, (9, 9)) == dst4
    assert pool.num_blocks == 3 and pool.num_free == 0


def test_shrink_refuses_when_live_blocks_do_not_fit() -> None:
    pool = BlockPool(4)
    held = [pool.take() for _ in range(3)]
    with pytest.raises(ValueError, match="cannot shrink"):
        pool.shrink(2)
    assert pool.num_blocks == 4 and pool.num_free == 1 and len(held) == 3


def test_grow_adds_empty_blocks_in_front() -> None:
    pool = BlockPool(2)
    a = pool.take()
    pool.freeze(a, None, ROOT_UID, (1,))
    pool.release(a)
    pool.grow(4)
    assert pool.num_blocks == 4 and pool.num_free == 4
    assert pool.take() in (2, 3)  # new empty blocks are used before evicting a cached one
