"""KV blocks: reference counts, the free queue, and the exact prefix-cache registry.

Plain Python, no torch. A block whose contents are final is *frozen*: it gets a unique
``uid``, its chained hash ``hash(parent_hash, tokens)`` and the token ids it holds. Frozen
blocks are never written again (writers copy them first), so a (parent uid, tokens) pair
names one exact KV content. Lookups go through the hash, but a hit is confirmed by comparing
the stored token ids and the parent's uid, never on the hash alone.

Blocks with no reference sit in the free queue: unfrozen ones at the front (nothing to
lose), frozen ones in least-recently-released order behind them. Taking a block pops the
front, which evicts the least recently used cached content only when no empty block is left.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

HashFn = Callable[[int | None, tuple[int, ...]], int]
ROOT_UID = 0  # the parent uid of a sequence's first block


def chain_hash(parent: int | None, tokens: tuple[int, ...]) -> int:
    # Python's hash of a tuple of ints does not depend on PYTHONHASHSEED.
    return hash((parent, tokens))


@dataclass(slots=True)
class Block:
    block_id: int
    ref_count: int = 0
    uid: int = 0  # 0: not frozen
    hash: int | None = None
    parent_uid: int = ROOT_UID
    tokens: tuple[int, ...] = ()

    @property
    def frozen(self) -> bool:
        return self.uid != 0


class BlockPool:
    def __init__(self, num_blocks: int, hash_fn: HashFn = chain_hash) -> None:
        if num_blocks < 1:
            raise ValueError("the KV cache needs at least one block")
        self.hash_fn = hash_fn
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self.registry: dict[int, int] = {}  # chained hash -> frozen block id
        self._next_uid = ROOT_UID + 1

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free(self) -> int:
        return len(self.free)

    def take(self) -> int:
        """A block with one reference, evicting cached content if it has to."""
        bid, _ = self.free.popitem(last=False)
        self._forget(self.blocks[bid])
        self.blocks[bid].ref_count = 1
        return bid

    def acquire(self, bid: int) -> None:
        block = self.blocks[bid]
        if block.ref_count == 0:
            del self.free[bid]
        block.ref_count += 1

    def release(self, bid: int) -> None:
        block = self.blocks[bid]
        if block.ref_count <= 0:
            raise RuntimeError(f"block {bid} released more often than acquired")
        block.ref_count -= 1
        if block.ref_count == 0:
            self.free[bid] = None
            if not block.frozen:
                self.free.move_to_end(bid, last=False)

    def freeze(self, bid: int, parent_hash: int | None, parent_uid: int, tokens: tuple[int, ...]) -> None:
        """Mark a block's contents final and make it findable (unless an entry already holds
        its hash: then it keeps a uid, so its own chain goes on, but is not registered)."""
        block = self.blocks[bid]
        block.uid, self._next_uid = self._next_uid, self._next_uid + 1
        block.hash = self.hash_fn(parent_hash, tokens)
        block.parent_uid, block.tokens = parent_uid, tokens
        self.registry.setdefault(block.hash, bid)

    def lookup(self, parent_hash: int | None, parent_uid: int, tokens: tuple[int, ...]) -> int | None:
        """The frozen block holding exactly ``tokens`` after the block ``parent_uid``."""
        bid = self.registry.get(self.hash_fn(parent_hash, tokens))
        if bid is None:
            return None
        block = self.blocks[bid]
        if block.tokens != tokens or block.parent_uid != parent_uid:
            return None  # a hash collision: different contents
        return bid

    def _forget(self, block: Block) -> None:
        if block.frozen and block.hash is not None and self.registry.get(block.hash) == block.block_id:
            del self.registry[block.hash]
        block.uid, block.hash, block.parent_uid, block.tokens = 0, None, ROOT_UID, ()

    def grow(self, num_blocks: int) -> None:
        for bid in range(self.num_blocks, num_blocks):
            self.blocks.append(Block(bid))
            self.free[bid] = None
            self.free.move_to_end(bid, last=False)

    def shrink(self, num_blocks: int) -> list[tuple[int, int]]:
        """Drop blocks ``num_blocks..``: free ones are discarded (cached content evicted),
        live ones move into free blocks below the cut. Returns the moves (src, dst)."""
        tail = self.blocks[num_blocks:]
        live = [b for b in tail if b.ref_count > 0]
        spare = self.num_free - (len(tail) - len(live))
        if len(live) > spare:
            raise ValueError(
                f"cannot shrink to {num_blocks} blocks: {len(live)} live blocks above the cut, "
                f"only {spare} free below it"
            )
        for b in tail:
            if b.ref_count == 0:
                del self.free[b.block_id]
                self._forget(b)
        moves = []
        for src in live:
            dst = self.blocks[self.take()]
            dst.ref_count, dst.uid, dst.hash = src.ref_count, src.uid, src.hash
            dst.parent_uid, dst.tokens = src.parent_uid, src.tokens
            if src.hash is not None and self.registry.get(src.hash) == src.block_id:
                self.registry[src.hash] = dst.block_id
            moves.append((src.block_id, dst.block_id))
        del self.blocks[num_blocks:]
        return moves
