"""ModelRunner: a step's scheduled chunks -> flat tensors -> model forward -> logits."""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass

import numpy as np
import torch

from .attention import AttentionMetadata, DecodeGroup, PagedDecode, PrefillSpan
from .decode_graphs import DecodeGraphs
from .kv_cache import allocate_kv_cache, cache_rows, write_slots
from .models.llama import LlamaModel
from .paged_kernel import PagedDecodeFn, load_kernel
from .scheduler import ScheduledChunk

# Decode rows are gathered in groups of similar context length so that padding stays small;
# a new group starts when a row's context is under this fraction of the group's longest.
GROUP_SPLIT_RATIO = 0.6
MIN_GROUP_SIZE = 4
# The paged kernel reads a row's keys once per row: past this context a chunk's rows would
# stream its K/V from memory again and again, where the prefill path's matmuls tile them.
PAGED_CHUNK_MAX_CONTEXT = 4096


@dataclass(frozen=True, slots=True)
class StepOutput:
    """Logits [rows, vocab] (float32) for the chunks that sample, in the same order: one row
    per chunk, 1 + num_draft rows for a chunk with draft tokens (one per verified position)."""

    logits: torch.Tensor
    sampled: tuple[ScheduledChunk, ...]


@dataclass(frozen=True, slots=True)
class GraphLimits:
    """Decode graphs on: the largest batch and block table (blocks per sequence) they cover."""

    max_batch: int
    max_blocks: int


class ModelRunner:
    """Owns the model and its KV cache; executes one step at a time."""

    def __init__(
        self,
        model: LlamaModel,
        num_blocks: int,
        block_size: int,
        attention: str = "gather",
        graphs: GraphLimits | None = None,
    ) -> None:
        self.model = model
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.device = model.embed_tokens.device
        self.paged_kernel = _paged_kernel(attention, self.device, model.dtype)
        self.attention_backend = "paged" if self.paged_kernel is not None else "gather"
        config = model.config
        # With decode graphs one more block, never handed out, takes the padding rows' K/V.
        allocated = num_blocks + (graphs is not None)
        self.kv_caches = allocate_kv_cache(config, allocated, block_size, model.dtype, self.device)
        self._kv_heads = config.num_kv_heads
        self._workspace: tuple[torch.Tensor, torch.Tensor] | None = None
        self.graphs = (
            DecodeGraphs(
                model, self.kv_caches, block_size, num_blocks, graphs.max_batch, graphs.max_blocks
            )
            if graphs is not None
            else None
        )

    @torch.inference_mode()
    def execute(self, chunks: Seq[ScheduledChunk]) -> StepOutput:
        if self.graphs is not None and self.graphs.accepts(chunks):
            return self._logits(self.graphs.run(chunks), chunks)
        singles = sorted(
            (c for c in chunks if c.num_tokens == 1), key=lambda c: c.start, reverse=True
        )
        # With the paged kernel every position is a row over its sequence's table (a chunk's
        # row i sees start + i + 1 keys: causal without a mask), but for chunks of long
        # contexts; otherwise decode groups gather their blocks. Other multi-token chunks are
        # prefill spans.
        multis = [c for c in chunks if c.num_tokens > 1]
        rowed = [c for c in multis if self._in_kernel(c)]
        spans = [c for c in multis if not self._in_kernel(c)]
        ordered = [*singles, *rowed, *spans]
        input_ids, positions, write_index = self._flatten(ordered)
        paged = self._paged_rows([*singles, *rowed])
        groups = self._decode_groups(singles) if paged is None else ()
        before = len(singles) + sum(c.num_tokens for c in rowed)
        prefills = self._prefill_spans(spans, start=before)
        gathered = [g.gather_index.shape[0] for g in groups] + [
            p.gather_index.shape[0] for p in prefills if p.gather_index is not None
        ]
        meta = AttentionMetadata(
            write_index=self._tensor(write_index),
            decode_groups=groups,
            prefills=prefills,
            workspace=self._workspace_for(max(gathered, default=0)),
            paged=paged,
        )
        hidden = self.model(self._tensor(input_ids), self._tensor(positions), self.kv_caches, meta)
        return self._logits(hidden, ordered)

    def _logits(self, hidden: torch.Tensor, ordered: Seq[ScheduledChunk]) -> StepOutput:
        """Logits of the sampling rows of `hidden` (laid out as `ordered`'s tokens)."""
        rows: list[int] = []
        sampled: list[ScheduledChunk] = []
        offset = 0
        for chunk in ordered:
            offset += chunk.num_tokens
            if chunk.samples:
                rows.extend(range(offset - 1 - chunk.num_draft, offset))
                sampled.append(chunk)
        if not rows:
            empty = torch.empty(0, self.model.config.vocab_size, device=self.device)
            return StepOutput(empty, ())
        logits = self.model.compute_logits(hidden[self._tensor(rows)])
        return StepOutput(logits, tuple(sampled))

    def _workspace_for(self, rows: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Gather buffers with room for `rows` block rows, grown (never shrunk) on demand."""
        if rows == 0:
            return self._workspace
        if self._workspace is None or self._workspace[0].shape[0] < rows:
            # Headroom so a slowly growing batch does not reallocate every step.
            capacity = rows + rows // 4
            shape = (capacity, self.block_size, self.model.config.head_dim)
            dtype = self.model.dtype
            self._workspace = (
                torch.empty(shape, dtype=dtype, device=self.device),
                torch.empty(shape, dtype=dtype, device=self.device),
            )
        return self._workspace

    def _tensor(self, values: Seq[int] | np.ndarray) -> torch.Tensor:
        return torch.as_tensor(np.asarray(values, dtype=np.int64), device=self.device)

    def _flatten(self, chunks: Seq[ScheduledChunk]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        size = self.block_size
        input_ids: list[int] = []
        positions: list[np.ndarray] = []
        blocks: list[np.ndarray] = []
        for chunk in chunks:
            input_ids.extend(chunk.token_ids())
            pos = np.arange(chunk.start, chunk.end, dtype=np.int64)
            positions.append(pos)
            blocks.append(np.asarray(chunk.seq.block_table, dtype=np.int64)[pos // size])
        flat_positions = np.concatenate(positions)
        flat_blocks = np.concatenate(blocks)
        write_index = write_slots(flat_blocks, flat_positions % size, self._kv_heads, size)
        return np.asarray(input_ids, dtype=np.int64), flat_positions, write_index

    def _in_kernel(self, chunk: ScheduledChunk) -> bool:
        """Whether a multi-token chunk's rows go to the paged kernel."""
        return self.paged_kernel is not None and chunk.end <= PAGED_CHUNK_MAX_CONTEXT

    def _paged_rows(self, chunks: Seq[ScheduledChunk]) -> PagedDecode | None:
        """Every position of `chunks` as a kernel row: its key count and its chunk's table."""
        if self.paged_kernel is None or not chunks:
            return None
        size = self.block_size
        lens = np.concatenate([np.arange(c.start + 1, c.end + 1, dtype=np.int64) for c in chunks])
        tables = np.zeros((len(chunks), -(-int(lens.max()) // size)), dtype=np.int64)
        for i, chunk in enumerate(chunks):
            used = -(-chunk.end // size)
            tables[i, :used] = chunk.seq.block_table[:used]
        table_rows = np.repeat(np.arange(len(chunks)), [c.num_tokens for c in chunks])
        return PagedDecode(
            0,
            len(lens),
            self._tensor(tables),
            self._tensor(table_rows),
            self._tensor(lens),
            self.paged_kernel,
        )

    def _decode_groups(self, singles: Seq[ScheduledChunk]) -> tuple[DecodeGroup, ...]:
        """Groups of decode rows (sorted longest context first) with padded tables and masks."""
        groups: list[DecodeGroup] = []
        start = 0
        while start < len(singles):
            longest = singles[start].end
            stop = start + 1
            while stop < len(singles) and (
                stop - start < MIN_GROUP_SIZE or singles[stop].end >= GROUP_SPLIT_RATIO * longest
            ):
                stop += 1
            groups.append(self._decode_group(singles[start:stop], start))
            start = stop
        return tuple(groups)

    def _decode_group(self, rows: Seq[ScheduledChunk], start: int) -> DecodeGroup:
        size = self.block_size
        context = np.array([c.end for c in rows], dtype=np.int64)
        max_blocks = -(-int(context.max()) // size)
        tables = np.zeros((len(rows), max_blocks), dtype=np.int64)
        for i, chunk in enumerate(rows):
            used = -(-chunk.end // size)
            tables[i, :used] = chunk.seq.block_table[:used]
        index = cache_rows(tables, self._kv_heads).reshape(-1)
        keys = torch.arange(max_blocks * size, device=self.device)
        valid = keys[None, :] < self._tensor(context)[:, None]
        mask = self._additive(valid).view(len(rows), 1, 1, -1)
        return DecodeGroup(start, len(rows), self._tensor(index), mask)

    def _prefill_spans(self, multis: Seq[ScheduledChunk], start: int) -> tuple[PrefillSpan, ...]:
        spans: list[PrefillSpan] = []
        for chunk in multis:
            if chunk.start == 0:
                spans.append(PrefillSpan(start, chunk.num_tokens, chunk.end, None, None))
            else:
                used = -(-chunk.end // self.block_size)
                table = np.asarray(chunk.seq.block_table[:used], dtype=np.int64)
                index = cache_rows(table, self._kv_heads).reshape(-1)
                keys = torch.arange(chunk.end, device=self.device)
                queries = torch.arange(chunk.start, chunk.end, device=self.device)
                mask = self._additive(keys[None, :] <= queries[:, None])
                spans.append(
                    PrefillSpan(start, chunk.num_tokens, chunk.end, self._tensor(index), mask)
                )
            start += chunk.num_tokens
        return tuple(spans)

    def _additive(self, valid: torch.Tensor) -> torch.Tensor:
        zero = torch.zeros((), dtype=self.model.dtype, device=self.device)
        neg = torch.full((), float("-inf"), dtype=self.model.dtype, device=self.device)
        return torch.where(valid, zero, neg)


def _paged_kernel(attention: str, device: torch.device, dtype: torch.dtype) -> PagedDecodeFn | None:
    """The kernel for `attention` = paged, or auto on CPU float32; None selects the gather path.

    CUDA keeps the gather + SDPA path (one fused kernel per group there).
    """
    if attention == "gather" or device.type != "cpu" or dtype != torch.float32:
        return None
    return load_kernel()
