"""Decode-only steps at fixed shapes, replayed as CUDA graphs.

A step whose chunks are all single-token decodes (no prefill, no drafts) runs here instead of
the general path: its rows are padded to a batch bucket (1, 2, 4, 8, then multiples of 8)
and its block tables to a block bucket (powers of two), so every tensor the forward reads
has a shape fixed per (batch, blocks) pair and lives at a fixed address. On CUDA each pair is
captured once as a graph and replayed: one launch for the whole forward instead of a few
hundred kernel launches, which is what bounds small-batch decode on a GPU. On CPU the same
fixed-shape path runs eagerly (no speed-up; it is how the tests check the padding).

Padding rows read and write one scratch block that the block manager never hands out (the KV
cache is allocated one block larger), attend to its first key only, and are dropped from the
output. A capture that fails disables graphs for the engine's life (logged once): the general
path then serves every step.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence as Seq
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .attention import AttentionMetadata, DecodeGroup
from .kv_cache import KVCache, cache_rows, write_slots
from .models.llama import LlamaModel
from .scheduler import ScheduledChunk

log = logging.getLogger(__name__)

SMALL_BATCHES = (1, 2, 4)
BATCH_STEP = 8


def batch_bucket(rows: int) -> int:
    """Smallest bucket holding `rows`: 1, 2, 4, then the next multiple of 8."""
    for bucket in SMALL_BATCHES:
        if rows <= bucket:
            return bucket
    return -(-rows // BATCH_STEP) * BATCH_STEP


def block_bucket(blocks: int) -> int:
    """Smallest power of two holding `blocks` (at least 1)."""
    return 1 << max(0, blocks - 1).bit_length()


@dataclass(slots=True)
class _Static:
    """One (batch, blocks) shape: its input buffers, its output and (on CUDA) its graph."""

    input_ids: torch.Tensor  # [batch]
    positions: torch.Tensor  # [batch]
    write_index: torch.Tensor  # [batch * kv_heads]
    gather_index: torch.Tensor  # [batch * kv_heads * blocks]
    mask: torch.Tensor  # additive [batch, 1, 1, blocks * block_size]
    hidden: torch.Tensor | None = None  # output of the last run / the captured forward
    graph: torch.cuda.CUDAGraph | None = None

    def meta(self, batch: int) -> AttentionMetadata:
        group = DecodeGroup(0, batch, self.gather_index, self.mask)
        return AttentionMetadata(write_index=self.write_index, decode_groups=(group,), prefills=())


@dataclass(frozen=True, slots=True)
class _Inputs:
    """A step's padded host-side inputs (numpy) for one (batch, blocks) shape."""

    input_ids: np.ndarray
    positions: np.ndarray
    write_index: np.ndarray
    gather_index: np.ndarray
    valid_keys: np.ndarray  # [batch] keys each row attends to (1 for padding rows)


class DecodeGraphs:
    """Runs decode-only steps at bucketed shapes; captures and replays graphs on CUDA."""

    def __init__(
        self,
        model: LlamaModel,
        kv_caches: list[KVCache],
        block_size: int,
        scratch_block: int,
        max_batch: int,
        max_blocks: int,
    ) -> None:
        self.model = model
        self.kv_caches = kv_caches
        self.block_size = block_size
        self.scratch_block = scratch_block
        self.max_batch = batch_bucket(max_batch)
        self.max_blocks = block_bucket(max_blocks)
        self.device = model.embed_tokens.device
        self.capture = self.device.type == "cuda"
        self.enabled = True
        self.num_kv_heads = model.config.num_kv_heads
        self._shapes: dict[tuple[int, int], _Static] = {}
        self._pool: Any = None  # the graphs' shared memory pool (torch's opaque handle)

    def accepts(self, chunks: Seq[ScheduledChunk]) -> bool:
        """Whether this step is decode-only and fits the largest shapes."""
        return (
            self.enabled
            and bool(chunks)
            and len(chunks) <= self.max_batch
            and all(c.num_tokens == 1 and not c.num_draft for c in chunks)
        )

    def run(self, chunks: Seq[ScheduledChunk]) -> torch.Tensor:
        """Hidden states [len(chunks), hidden] for single-token chunks, in their order."""
        blocks = block_bucket(max(-(-c.end // self.block_size) for c in chunks))
        key = (batch_bucket(len(chunks)), min(blocks, self.max_blocks))
        inputs = self._inputs(chunks, *key)
        static = self._shapes.get(key)
        if static is None:
            static = self._shapes[key] = self._allocate(*key)
        self._load(static, inputs)
        if self.capture and self.enabled and static.graph is None:
            self._try_capture(static, key[0])
        if static.graph is None:
            return self._eager(static, key[0])[: len(chunks)]
        static.graph.replay()
        assert static.hidden is not None
        return static.hidden[: len(chunks)]

    def _inputs(self, chunks: Seq[ScheduledChunk], batch: int, blocks: int) -> _Inputs:
        size, kv_heads = self.block_size, self.num_kv_heads
        tables = np.full((batch, blocks), self.scratch_block, dtype=np.int64)
        input_ids = np.zeros(batch, dtype=np.int64)
        positions = np.zeros(batch, dtype=np.int64)
        valid = np.ones(batch, dtype=np.int64)
        slots = np.full(batch, self.scratch_block * size, dtype=np.int64)  # block * size + offset
        for i, chunk in enumerate(chunks):
            used = -(-chunk.end // size)
            tables[i, :used] = chunk.seq.block_table[:used]
            input_ids[i] = chunk.token_ids()[0]
            positions[i] = chunk.start
            valid[i] = chunk.end
            block = chunk.seq.block_table[chunk.start // size]
            slots[i] = block * size + chunk.start % size
        write = write_slots(slots // size, slots % size, kv_heads, size)
        gather = cache_rows(tables, kv_heads).reshape(-1)
        return _Inputs(input_ids, positions, write, gather, valid)

    def _allocate(self, batch: int, blocks: int) -> _Static:
        kv_heads, device = self.num_kv_heads, self.device

        def index(n: int) -> torch.Tensor:
            return torch.zeros(n, dtype=torch.int64, device=device)

        return _Static(
            input_ids=index(batch),
            positions=index(batch),
            write_index=index(batch * kv_heads),
            gather_index=index(batch * kv_heads * blocks),
            mask=torch.zeros(
                batch, 1, 1, blocks * self.block_size, dtype=self.model.dtype, device=device
            ),
        )

    def _load(self, static: _Static, inputs: _Inputs) -> None:
        """Copy a step's inputs into the shape's fixed buffers (addresses never change)."""
        static.input_ids.copy_(torch.from_numpy(inputs.input_ids))
        static.positions.copy_(torch.from_numpy(inputs.positions))
        static.write_index.copy_(torch.from_numpy(inputs.write_index))
        static.gather_index.copy_(torch.from_numpy(inputs.gather_index))
        keys = torch.arange(static.mask.shape[-1])
        valid = keys[None, :] < torch.from_numpy(inputs.valid_keys)[:, None]
        additive = torch.zeros(valid.shape, dtype=static.mask.dtype)
        additive.masked_fill_(~valid, float("-inf"))
        static.mask.copy_(additive.view_as(static.mask))

    @torch.inference_mode()
    def _eager(self, static: _Static, batch: int) -> torch.Tensor:
        hidden: torch.Tensor = self.model(
            static.input_ids, static.positions, self.kv_caches, static.meta(batch)
        )
        static.hidden = hidden
        return hidden

    @torch.inference_mode()
    def _try_capture(self, static: _Static, batch: int) -> None:
        """Capture the shape's forward (after a warm-up on a side stream, as CUDA requires)."""
        try:
            stream = torch.cuda.Stream()  # type: ignore[no-untyped-call]
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                self._eager(static, batch)  # the loaded inputs: a real step, output unused
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool):
                static.hidden = self.model(
                    static.input_ids, static.positions, self.kv_caches, static.meta(batch)
                )
            self._pool = graph.pool()
            static.graph = graph
        except RuntimeError as err:  # keep serving on the general path
            self.enabled = False
            log.warning("CUDA graph capture failed; decode runs without graphs: %s", err)
