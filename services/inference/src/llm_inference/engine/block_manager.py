"""Paged KV block allocator with prefix caching: chained block hashes, ref counts, LRU reuse."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from .sequence import Sequence

# Parent "hash" of a sequence's first block.
ROOT_HASH = 0


@dataclass(slots=True)
class Block:
    """One fixed-size KV block; `block_hash` is set once it is full and its KV computed."""

    block_id: int
    ref_count: int = 0
    block_hash: int | None = None
    parent_hash: int = ROOT_HASH
    token_ids: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class PrefixHit:
    """Cached blocks that cover a prefix of a sequence, with their chained hashes."""

    blocks: tuple[Block, ...]
    hashes: tuple[int, ...]

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)


NO_HIT = PrefixHit((), ())


def block_hash(parent_hash: int, token_ids: tuple[int, ...]) -> int:
    """Hash of a full block chained on its parent's, so equal hashes imply equal prefixes."""
    return hash((parent_hash, token_ids))


class BlockManager:
    """Owns the KV blocks: allocation, freeing, and the hash -> block prefix cache.

    Freed blocks keep their hash and stay findable until they are reused; the free list is
    LRU-ordered (evict from the front), with never-hashed blocks placed at the front so cached
    content is evicted last.
    """

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError("num_blocks and block_size must be > 0")
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self._free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self._cached: dict[int, Block] = {}
        self.queried_tokens = 0
        self.hit_tokens = 0

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def usage(self) -> float:
        return 1.0 - len(self._free) / len(self.blocks)

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.queried_tokens if self.queried_tokens else 0.0

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def block_hashes(self, seq: Sequence, count: int) -> list[int]:
        """Chained hashes of the sequence's first `count` full blocks (computed once, cached)."""
        size = self.block_size
        hashes = seq.block_hashes
        tokens = seq.token_ids
        while len(hashes) < count:
            i = len(hashes)
            parent = hashes[-1] if hashes else ROOT_HASH
            hashes.append(block_hash(parent, tuple(tokens[i * size : (i + 1) * size])))
        return hashes

    def lookup(self, seq: Sequence) -> PrefixHit:
        """Longest cached run of full blocks of the sequence, never covering its last token."""
        if not self.enable_prefix_caching:
            return NO_HIT
        size = self.block_size
        tokens = seq.token_ids
        full = (len(tokens) - 1) // size  # the last token is always recomputed for its logits
        hashes = self.block_hashes(seq, full)
        blocks: list[Block] = []
        parent = ROOT_HASH
        for i in range(full):
            block = self._cached.get(hashes[i])
            if block is None or block.parent_hash != parent:
                break
            if block.token_ids != tuple(tokens[i * size : (i + 1) * size]):
                break  # a hash collision: never serve another prompt's KV
            blocks.append(block)
            parent = hashes[i]
        return PrefixHit(tuple(blocks), tuple(hashes[: len(blocks)]))

    def can_admit(self, hit: PrefixHit, num_tokens: int) -> bool:
        """Whether a sequence with this prefix hit can get blocks for `num_tokens` tokens."""
        new_blocks = max(self.blocks_for(num_tokens) - hit.num_blocks, 0)
        revived = sum(1 for block in hit.blocks if block.ref_count == 0)
        return new_blocks + revived <= len(self._free)

    def admit(self, seq: Sequence, hit: PrefixHit, num_tokens: int) -> None:
        """Take the hit blocks and allocate the rest so the first `num_tokens` tokens have slots."""
        assert not seq.block_table, "admit() is for sequences without blocks"
        for block in hit.blocks:
            if block.ref_count == 0:
                del self._free[block.block_id]
            block.ref_count += 1
        seq.block_table = [block.block_id for block in hit.blocks]
        seq.num_registered_blocks = hit.num_blocks
        seq.num_computed_tokens = hit.num_blocks * self.block_size
        self.grow(seq, num_tokens)

    def record_query(self, num_prompt_tokens: int, num_hit_tokens: int) -> None:
        self.queried_tokens += num_prompt_tokens
        self.hit_tokens += num_hit_tokens

    def can_grow(self, seq: Sequence, num_tokens: int) -> bool:
        return self.blocks_for(num_tokens) - len(seq.block_table) <= len(self._free)

    def grow(self, seq: Sequence, num_tokens: int) -> None:
        """Allocate fresh blocks until the sequence has slots for `num_tokens` tokens."""
        needed = self.blocks_for(num_tokens) - len(seq.block_table)
        if needed > len(self._free):
            raise RuntimeError("grow() without enough free blocks; call can_grow() first")
        for _ in range(needed):
            seq.block_table.append(self._pop_free().block_id)

    def free(self, seq: Sequence) -> None:
        """Release the sequence's blocks (tail first, so its tail is evicted before its head)."""
        for block_id in reversed(seq.block_table):
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                self._free[block_id] = None
                if block.block_hash is None:
                    self._free.move_to_end(block_id, last=False)
        seq.block_table = []
        seq.num_registered_blocks = 0

    def cache_full_blocks(self, seq: Sequence) -> None:
        """Register blocks that became full and computed, so later prompts can reuse them."""
        if not self.enable_prefix_caching:
            return
        size = self.block_size
        full = min(seq.num_computed_tokens // size, len(seq.block_table))
        if full <= seq.num_registered_blocks:
            return
        hashes = self.block_hashes(seq, full)
        tokens = seq.token_ids
        for i in range(seq.num_registered_blocks, full):
            block = self.blocks[seq.block_table[i]]
            h = hashes[i]
            if block.block_hash is None and h not in self._cached:
                parent = hashes[i - 1] if i else ROOT_HASH
                block.block_hash, block.parent_hash = h, parent
                block.token_ids = tuple(tokens[i * size : (i + 1) * size])
                self._cached[h] = block
        seq.num_registered_blocks = full

    def _pop_free(self) -> Block:
        block_id, _ = self._free.popitem(last=False)
        block = self.blocks[block_id]
        if block.block_hash is not None:
            # Evicting cached content: forget its hash before the block is overwritten.
            if self._cached.get(block.block_hash) is block:
                del self._cached[block.block_hash]
            block.block_hash, block.parent_hash, block.token_ids = None, ROOT_HASH, ()
        block.ref_count = 1
        return block
