"""Block tables of sequences over a BlockPool: prefix reuse, allocation, copy-on-write,
truncation (speculative rollback), free, and resizing of the pool; ``check_integrity``
proves the books balance (the engine tests run it after every step).

Plain Python, no torch: the engine applies the block copies this class asks for
(``take_copies``) with ``KVCache.copy`` before the step's forward. One manager per model, so
a drafter with its own paged KV gets its own manager keyed by the same sequence ids.

Rules that keep reuse exact: only frozen blocks are shared through the cache; a sequence
never writes into a block that is frozen or shared (it gets a private copy first); the
source of a pending copy stays referenced until the copy has been taken.
"""

from __future__ import annotations

from collections import Counter

from worker.engine.block_pool import ROOT_UID, BlockPool, HashFn, chain_hash


class BlockManager:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_prefix_caching: bool = True,
        hash_fn: HashFn = chain_hash,
    ) -> None:
        self.block_size = block_size
        self.prefix_caching = enable_prefix_caching
        self.pool = BlockPool(num_blocks, hash_fn)
        self.tables: dict[str, list[int]] = {}
        self._frozen: dict[str, int] = {}  # leading full blocks of a table known to be frozen
        self._copies: dict[int, int] = {}  # pending copy-on-write: dst -> src
        self._deferred: list[int] = []  # copy sources to release once the copies are taken
        self.prefix_queries = 0  # prompt tokens looked up
        self.prefix_hits = 0  # of which served from the cache

    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free

    def table(self, seq_id: str) -> list[int]:
        return self.tables.get(seq_id, [])

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # ------------------------------------------------------------------ prefix reuse

    def match_prefix(self, seq_id: str, tokens: list[int], reuse: bool = True) -> int:
        """Start ``seq_id``'s table with the cached blocks that hold a prefix of ``tokens``
        (full blocks, then possibly one partially filled tail block). Returns the number of
        tokens served; ``len(tokens)`` means an exact repeat of cached content. ``reuse``
        false: none (the sequence needs every prompt row computed)."""
        table = self.tables.setdefault(seq_id, [])
        if table:
            raise RuntimeError(f"{seq_id} already has blocks")
        self._frozen[seq_id] = 0
        self.prefix_queries += len(tokens)
        if not (self.prefix_caching and reuse):
            return 0
        bs, pool = self.block_size, self.pool
        parent_hash: int | None = None
        parent_uid, matched = ROOT_UID, 0
        while matched + bs <= len(tokens):
            bid = pool.lookup(parent_hash, parent_uid, tuple(tokens[matched : matched + bs]))
            if bid is None:
                break
            pool.acquire(bid)
            table.append(bid)
            parent_hash, parent_uid = pool.blocks[bid].hash, pool.blocks[bid].uid
            matched += bs
        self._frozen[seq_id] = len(table)
        for n in range(min(bs - 1, len(tokens) - matched), 0, -1):
            bid = pool.lookup(parent_hash, parent_uid, tuple(tokens[matched : matched + n]))
            if bid is not None:
                pool.acquire(bid)
                table.append(bid)
                matched += n
                break
        self.prefix_hits += matched
        return matched

    def forget_query(self, queried: int, matched: int) -> None:
        """Undo the counts of a lookup whose admission was called off (it will be retried)."""
        self.prefix_queries -= queried
        self.prefix_hits -= matched

    def commit(self, seq_id: str, tokens: list[int], num_tokens: int) -> None:
        """The KV of ``tokens[:num_tokens]`` is final: freeze the full blocks it covers."""
        if not self.prefix_caching:
            return
        table, pool, bs = self.tables[seq_id], self.pool, self.block_size
        i = self._frozen[seq_id]
        while (i + 1) * bs <= num_tokens:
            parent = pool.blocks[table[i - 1]] if i > 0 else None
            block = pool.blocks[table[i]]
            if not block.frozen:
                pool.freeze(
                    block.block_id,
                    parent.hash if parent else None,
                    parent.uid if parent else ROOT_UID,
                    tuple(tokens[i * bs : (i + 1) * bs]),
                )
            i += 1
        self._frozen[seq_id] = i

    def cache_tail(self, seq_id: str, tokens: list[int]) -> None:
        """Freeze the partially filled last block of a computed prompt so that an exact
        repeat finds the whole prompt cached (the sequence copies it before writing on)."""
        n = len(tokens) % self.block_size
        i = len(tokens) // self.block_size
        if not self.prefix_caching or n == 0 or self._frozen[seq_id] != i:
            return
        table, pool = self.tables[seq_id], self.pool
        if pool.blocks[table[i]].frozen:
            return
        parent = pool.blocks[table[i - 1]] if i > 0 else None
        pool.freeze(
            table[i],
            parent.hash if parent else None,
            parent.uid if parent else ROOT_UID,
            tuple(tokens[i * self.block_size :]),
        )

    # ------------------------------------------------------------------ allocation

    def blocks_needed(self, seq_id: str, start: int, end: int) -> int:
        """Free blocks that writing positions ``[start, end)`` takes: new blocks plus
        private copies of frozen or shared blocks in that range."""
        table, blocks = self.table(seq_id), self.pool.blocks
        first, last = start // self.block_size, self.blocks_for(end)
        copies = sum(1 for b in table[first:last] if blocks[b].frozen or blocks[b].ref_count > 1)
        return max(0, last - len(table)) + copies

    def allocate(self, seq_id: str, start: int, end: int) -> bool:
        """Make positions ``[start, end)`` writable; False (and no change) if short of blocks."""
        if self.blocks_needed(seq_id, start, end) > self.pool.num_free:
            return False
        table = self.tables.setdefault(seq_id, [])
        self._frozen.setdefault(seq_id, 0)
        pool = self.pool
        for i in range(start // self.block_size, self.blocks_for(end)):
            if i == len(table):
                table.append(pool.take())
                continue
            old = pool.blocks[table[i]]
            if old.frozen or old.ref_count > 1:
                new = pool.take()
                self._copies[new] = old.block_id
                self._deferred.append(old.block_id)
                table[i] = new
                # The private copy is not frozen: the frozen prefix ends before it (commit
                # freezes it again), so no block is ever frozen under an unfrozen parent.
                self._frozen[seq_id] = min(self._frozen[seq_id], i)
        return True

    def take_copies(self) -> list[tuple[int, int]]:
        """The (src, dst) block copies to apply before the next forward."""
        copies = [(src, dst) for dst, src in self._copies.items()]
        self._copies.clear()
        for bid in self._deferred:
            self.pool.release(bid)
        self._deferred.clear()
        return copies

    def truncate(self, seq_id: str, num_tokens: int) -> None:
        """Keep the first ``num_tokens`` positions (rollback of rejected draft tokens)."""
        table = self.tables[seq_id]
        keep = self.blocks_for(num_tokens)
        for bid in table[keep:]:
            self._release(bid)
        del table[keep:]
        self._frozen[seq_id] = min(self._frozen[seq_id], num_tokens // self.block_size)

    def free(self, seq_id: str) -> None:
        for bid in self.tables.pop(seq_id, []):
            self._release(bid)
        self._frozen.pop(seq_id, None)

    def _release(self, bid: int) -> None:
        self.pool.release(bid)
        if self.pool.blocks[bid].ref_count == 0:
            self._copies.pop(bid, None)  # nobody will read the copy any more

    def resize(self, num_blocks: int) -> list[tuple[int, int]]:
        """Grow or shrink the pool; returns the (src, dst) moves that evacuate live blocks
        from a released tail. Raises ValueError (changing nothing) if they cannot fit."""
        if self._copies or self._deferred:
            raise RuntimeError("take the pending copies before resizing")
        if num_blocks >= self.num_blocks:
            self.pool.grow(num_blocks)
            return []
        moves = self.pool.shrink(num_blocks)
        remap = dict(moves)
        for table in self.tables.values():
            table[:] = [remap.get(b, b) for b in table]
        return moves

    def check_integrity(self) -> None:
        """Raise AssertionError unless: every block's reference count is the number of block
        tables holding it (plus pending copy sources); the free queue holds exactly the
        unreferenced blocks, so free + used = total; every registry entry names a frozen
        block of that hash; and each table's frozen prefix is a chain whose hashes follow."""
        pool = self.pool
        refs = Counter(b for table in self.tables.values() for b in table) + Counter(self._deferred)
        for block in pool.blocks:
            assert block.ref_count == refs[block.block_id], (
                f"block {block.block_id}: ref_count {block.ref_count}, held {refs[block.block_id]} times"
            )
            assert (block.ref_count == 0) == (block.block_id in pool.free), (
                f"block {block.block_id} free and used"
            )
        used = sum(1 for b in pool.blocks if b.ref_count > 0)
        assert used + pool.num_free == pool.num_blocks, "free + used ≠ total"
        for h, bid in pool.registry.items():
            assert pool.blocks[bid].frozen and pool.blocks[bid].hash == h, (
                f"registry entry of block {bid} is stale"
            )
        for seq_id, table in self.tables.items():
            assert len(set(table)) == len(table), f"{seq_id} holds a block twice"
            parent_hash: int | None = None
            parent_uid = ROOT_UID
            for bid in table[: self._frozen.get(seq_id, 0)]:
                block = pool.blocks[bid]
                assert block.frozen and block.parent_uid == parent_uid, (
                    f"{seq_id}: block {bid} breaks the chain"
                )
                assert block.hash == pool.hash_fn(parent_hash, block.tokens), f"{seq_id}: block {bid}'s hash"
                parent_hash, parent_uid = block.hash, block.uid
