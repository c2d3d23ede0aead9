"""BlockManager: allocation, ref counts, chained hashes, LRU eviction, no full-prompt hit."""

from __future__ import annotations

import pytest

from llm_inference.engine.api import SamplingOptions
from llm_inference.engine.block_manager import ROOT_HASH, BlockManager, block_hash
from llm_inference.engine.sequence import Sequence

BS = 4


def _seq(tokens: list[int], rid: str = "s") -> Sequence:
    return Sequence(rid, list(tokens), len(tokens), SamplingOptions(), 16)


def _run_prefill(manager: BlockManager, seq: Sequence) -> None:
    """Admit with whatever prefix hits, then mark the whole prompt computed and cached."""
    hit = manager.lookup(seq)
    assert manager.can_admit(hit, seq.num_tokens)
    manager.admit(seq, hit, seq.num_tokens)
    seq.num_computed_tokens = seq.num_tokens
    manager.cache_full_blocks(seq)


def test_admit_allocates_enough_blocks_and_free_returns_them() -> None:
    manager = BlockManager(8, BS, enable_prefix_caching=True)
    seq = _seq(list(range(10)))
    _run_prefill(manager, seq)
    assert len(seq.block_table) == 3
    assert manager.num_free_blocks == 5
    assert manager.usage == pytest.approx(3 / 8)
    manager.free(seq)
    assert manager.num_free_blocks == 8
    assert seq.block_table == []


def test_hashes_chain_on_the_parent_block() -> None:
    a = block_hash(ROOT_HASH, (1, 2, 3, 4))
    b = block_hash(a, (5, 6, 7, 8))
    assert b != block_hash(ROOT_HASH, (5, 6, 7, 8))  # same tokens, different prefix
    assert a == block_hash(ROOT_HASH, (1, 2, 3, 4))


def test_shared_prefix_hits_bump_ref_counts() -> None:
    manager = BlockManager(16, BS, enable_prefix_caching=True)
    first = _seq([1, 2, 3, 4, 5, 6, 7, 8, 9], "a")
    _run_prefill(manager, first)
    second = _seq([1, 2, 3, 4, 5, 6, 7, 8, 42, 43], "b")
    hit = manager.lookup(second)
    assert hit.num_blocks == 2
    manager.admit(second, hit, second.num_tokens)
    assert second.num_computed_tokens == 8
    assert second.block_table[:2] == first.block_table[:2]
    assert [manager.blocks[b].ref_count for b in second.block_table[:2]] == [2, 2]
    manager.free(first)
    assert [manager.blocks[b].ref_count for b in second.block_table[:2]] == [1, 1]


def test_a_hit_never_covers_the_whole_prompt() -> None:
    manager = BlockManager(16, BS, enable_prefix_caching=True)
    tokens = list(range(12))  # exactly three full blocks
    _run_prefill(manager, _seq(tokens, "a"))
    hit = manager.lookup(_seq(tokens, "b"))
    assert hit.num_blocks == 2  # the block holding the last token is recomputed for its logits


def test_prefix_divergence_stops_the_hit() -> None:
    manager = BlockManager(16, BS, enable_prefix_caching=True)
    _run_prefill(manager, _seq(list(range(13)), "a"))
    changed = list(range(13))
    changed[5] = 99  # second block differs, so the third cannot match either
    assert manager.lookup(_seq(changed, "b")).num_blocks == 1


def test_freed_blocks_stay_cached_until_reused_lru_first() -> None:
    manager = BlockManager(6, BS, enable_prefix_caching=True)
    old = _seq([1, 1, 1, 1, 2, 2, 2, 2, 3], "old")
    _run_prefill(manager, old)
    manager.free(old)
    recent = _seq([7, 7, 7, 7, 8, 8, 8, 8, 9], "recent")
    _run_prefill(manager, recent)
    manager.free(recent)
    # Freed but still findable (admitting a hit on a free block revives it).
    assert manager.lookup(_seq([1, 1, 1, 1, 2, 2, 2, 2, 5])).num_blocks == 2
    # Take 3 fresh blocks: the two never-hashed partial blocks go first, then the least
    # recently used cached block, which is the tail of the older prompt (freed tail first).
    filler = _seq(list(range(100, 112)), "filler")
    manager.admit(filler, manager.lookup(filler), 12)
    assert manager.lookup(_seq([1, 1, 1, 1, 2, 2, 2, 2, 5])).num_blocks == 1
    assert manager.lookup(_seq([7, 7, 7, 7, 8, 8, 8, 8, 5])).num_blocks == 2
    more = _seq(list(range(200, 204)), "more")
    manager.admit(more, manager.lookup(more), 4)
    assert manager.lookup(_seq([1, 1, 1, 1, 2, 2, 2, 2, 5])).num_blocks == 0
    assert manager.lookup(_seq([7, 7, 7, 7, 8, 8, 8, 8, 5])).num_blocks == 2


def test_can_admit_counts_revived_blocks_against_free_space() -> None:
    manager = BlockManager(3, BS, enable_prefix_caching=True)
    seq = _seq([1, 2, 3, 4, 5, 6, 7, 8, 9], "a")
    _run_prefill(manager, seq)
    manager.free(seq)
    again = _seq([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13], "b")
    hit = manager.lookup(again)
    assert hit.num_blocks == 2
    assert manager.can_admit(hit, 12)  # 2 revived + 1 new = 3 free blocks
    assert not manager.can_admit(hit, 13)  # would need a 4th


def test_disabled_prefix_caching_never_hits() -> None:
    manager = BlockManager(8, BS, enable_prefix_caching=False)
    _run_prefill(manager, _seq(list(range(9)), "a"))
    assert manager.lookup(_seq(list(range(9)), "b")).num_blocks == 0


def test_hit_rate_statistics() -> None:
    manager = BlockManager(8, BS, enable_prefix_caching=True)
    manager.record_query(10, 0)
    manager.record_query(10, 8)
    assert manager.hit_rate == pytest.approx(8 / 20)
