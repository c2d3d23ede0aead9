"""EngineCore: the synchronous engine — admit requests, run steps, emit token events."""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Sequence as Seq
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer

from llm_common.config import ConfigError
from llm_common.detokenizer import Decoder

from .api import (
    EngineInfo,
    FinishReason,
    InvalidRequest,
    LoadSnapshot,
    Resume,
    SamplingOptions,
    TokenEvent,
)
from .block_manager import BlockManager
from .config import EngineConfig
from .grammar import CompiledFormat, GrammarCache, check_options
from .grammar_mask import GrammarMasker, GrammarStats, new_matcher
from .kv_cache import num_blocks_for_budget
from .loader import load_model
from .model_runner import GraphLimits, ModelRunner
from .models.config import CheckpointError, ModelConfig
from .models.llama import LlamaModel
from .output import RequestState
from .sampler import Sampler
from .scheduler import ScheduledChunk, Scheduler
from .sequence import Sequence
from .speculative import (
    SpeculativeConfig,
    SpeculativeStats,
    draft_for,
    next_draft_limit,
    verify,
)
from .validation import validate_request, validate_resume

log = logging.getLogger(__name__)

THROUGHPUT_WINDOW_S = 10.0


@dataclass(frozen=True, slots=True)
class Emitted:
    """An event for one request."""

    request_id: str
    event: TokenEvent


class EngineCore:
    """Owns scheduler, block manager, model runner and sampler; not thread-safe (one caller)."""

    def __init__(
        self,
        model: LlamaModel,
        config: EngineConfig,
        *,
        model_name: str,
        tokenizer: Decoder | None = None,
        grammars: GrammarCache | None = None,
    ) -> None:
        self.config = config
        self.model_name = model_name
        self.model_config = model.config
        self.tokenizer = tokenizer
        num_blocks = num_blocks_for_budget(
            model.config, config.kv_block_size, model.dtype, config.kv_cache_memory_bytes
        )
        if num_blocks < 2:
            raise ConfigError(
                f"kv_cache_memory_bytes: {config.kv_cache_memory_bytes} bytes hold {num_blocks} "
                "KV blocks; at least 2 are needed",
                variable="kv_cache_memory_bytes",
            )
        self.max_context = _max_context(model.config, config, num_blocks)
        self.block_manager = BlockManager(
            num_blocks, config.kv_block_size, config.enable_prefix_caching
        )
        self.scheduler = Scheduler(
            self.block_manager, config.max_num_seqs, config.max_batched_tokens
        )
        graphs = (
            GraphLimits(config.max_num_seqs, -(-self.max_context // config.kv_block_size))
            if config.cuda_graphs
            else None
        )
        self.runner = ModelRunner(
            model, num_blocks, config.kv_block_size, config.attention_backend, graphs
        )
        default_generator = torch.Generator(device=self.runner.device)
        default_generator.manual_seed(config.seed)
        self.sampler = Sampler(default_generator)
        if grammars is None:  # output formats compile here; without a tokenizer, none do
            eos = model.config.eos_token_ids
            grammars = GrammarCache(None, vocab_size=model.config.vocab_size, stop_token_ids=eos)
        self.grammars = grammars
        self.grammar_masker = GrammarMasker(model.config.vocab_size, config.max_num_seqs)
        self._states: dict[str, RequestState] = {}
        self._arrivals = 0
        self._produced: deque[tuple[float, int]] = deque()
        self.num_steps = 0
        self.speculative = SpeculativeConfig(
            num_tokens=config.speculative_tokens,
            ngram_max=config.speculative_ngram_max,
            ngram_min=config.speculative_ngram_min,
            max_batch=config.speculative_max_batch,
        )
        self.speculative_stats = SpeculativeStats()

    @classmethod
    def from_checkpoint(cls, path: Path, config: EngineConfig, model_name: str) -> EngineCore:
        """Load weights (and tokenizer.json when present) from an HF checkpoint directory."""
        if config.num_threads is not None and config.device == "cpu":
            torch.set_num_threads(config.num_threads)
        model_config = ModelConfig.from_dir(path)
        max_positions = _max_context(model_config, config, None)
        model = load_model(
            path,
            dtype=config.dtype,
            device=config.device,
            max_positions=max_positions,
            quantization=config.quantization,
        )
        tokenizer_file = path / "tokenizer.json"
        grammars = GrammarCache(
            tokenizer_file if tokenizer_file.is_file() else None,
            vocab_size=model_config.vocab_size,
            stop_token_ids=model_config.eos_token_ids,
        )
        tokenizer = load_tokenizer(path)
        return cls(model, config, model_name=model_name, tokenizer=tokenizer, grammars=grammars)

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work

    @property
    def num_requests(self) -> int:
        return len(self._states)

    @property
    def grammar_stats(self) -> GrammarStats:
        """Constrained decoding: recent per-step mask times (ms) and counters."""
        return self.grammar_masker.stats

    def validate(
        self,
        request_id: str,
        prompt: Seq[int],
        sampling: SamplingOptions,
        resume: Resume | None = None,
    ) -> None:
        vocab, context = self.model_config.vocab_size, self.max_context
        validate_request(
            request_id,
            prompt,
            sampling,
            vocab_size=vocab,
            max_context=context,
            has_tokenizer=self.tokenizer is not None,
        )
        check_options(sampling)
        if resume is not None:
            validate_resume(len(prompt), resume, sampling, vocab_size=vocab, max_context=context)

    def add_request(
        self,
        request_id: str,
        prompt: Seq[int],
        sampling: SamplingOptions,
        priority: int = 0,
        arrival: float | None = None,
        grammar: CompiledFormat | None = None,
        resume: Resume | None = None,
    ) -> None:
        """Queue a request; raises InvalidRequest for bad input or a duplicate id.

        `grammar` is sampling.output_format compiled ahead (AsyncEngine compiles off this
        thread); without it a format is compiled here, blocking. `resume` continues an answer
        another replica started: its tokens count as generated, not as prompt.
        """
        self.validate(request_id, prompt, sampling, resume)
        if request_id in self._states:
            raise InvalidRequest(f"request_id {request_id!r} is already running")
        if grammar is None and sampling.output_format is not None:
            grammar = self.grammars.compile(sampling.output_format)
        resumed = () if resume is None else resume.token_ids
        seq = Sequence(
            request_id=request_id,
            token_ids=[int(t) for t in prompt] + [int(t) for t in resumed],
            num_prompt_tokens=len(prompt),
            sampling=sampling,
            max_completion_tokens=min(sampling.max_tokens, self.max_context - len(prompt)),
            priority=priority,
            arrival_index=self._arrivals,
            grammar=None if grammar is None else new_matcher(grammar),
        )
        if seq.grammar is not None and not all(seq.grammar.accept_token(t) for t in resumed):
            raise InvalidRequest("resume.token_ids do not follow the output format", "resume")
        now = time.perf_counter() if arrival is None else arrival
        eos = self.model_config.eos_token_ids
        state = RequestState(seq, self.tokenizer, eos, now, resume)
        self._arrivals += 1
        self.scheduler.add(seq)
        self._states[request_id] = state

    def abort_request(
        self, request_id: str, reason: FinishReason = FinishReason.CANCELLED
    ) -> Emitted | None:
        """End a request now and free its blocks; None when it is unknown or already done."""
        state = self._states.pop(request_id, None)
        if state is None:
            return None
        self.scheduler.finish(state.seq)
        return Emitted(request_id, state.finish_without_token(reason, time.perf_counter()))

    def abort_all(self, reason: FinishReason) -> list[Emitted]:
        return [e for rid in list(self._states) if (e := self.abort_request(rid, reason))]

    def step(self) -> list[Emitted]:
        """Schedule and run one step; return the events it produced."""
        draft_for(self.scheduler.running, self.speculative, self.max_context)
        output = self.scheduler.schedule()
        if output.is_empty:
            return []
        now = time.perf_counter()
        for chunk in output.chunks:
            self._states[chunk.seq.request_id].mark_scheduled(now)
        result = self.runner.execute(output.chunks)
        for chunk in output.chunks:
            chunk.seq.num_computed_tokens = chunk.end - chunk.num_draft
            self.block_manager.cache_full_blocks(chunk.seq)
        plain, drafted = split_rows(result.sampled)
        logits = result.logits if not drafted else result.logits[[r for r, _ in plain]]
        emitted = self._sample(logits, [c.seq for _, c in plain]) if plain else []
        if drafted:
            emitted += self._verify(result.logits, drafted)
        self._record_throughput(time.perf_counter(), len(emitted))
        self.num_steps += 1
        return emitted

    def _sample(self, logits: torch.Tensor, seqs: list[Sequence]) -> list[Emitted]:
        """One token per row through the sampler (grammar masks, penalties, logprobs)."""
        constrained = self.grammar_masker.apply(logits, seqs)
        sample = self.sampler(logits, seqs, self.model_config.eos_token_ids)
        self.grammar_masker.accept(seqs, sample.token_ids, logits, constrained)
        now = time.perf_counter()
        emitted: list[Emitted] = []
        for seq, token, logprob, top in zip(
            seqs, sample.token_ids, sample.logprobs, sample.top_logprobs, strict=True
        ):
            state = self._states[seq.request_id]
            emitted.append(Emitted(seq.request_id, state.append(token, logprob, now, top)))
            if state.finished:
                del self._states[seq.request_id]
                self.scheduler.finish(seq)
        return emitted

    def _verify(
        self, logits: torch.Tensor, drafted: list[tuple[int, ScheduledChunk]]
    ) -> list[Emitted]:
        """Greedy verification of drafted chunks: emit the agreed prefix and one more token."""
        greedy: list[int] = logits.argmax(dim=-1).tolist()
        now = time.perf_counter()
        emitted: list[Emitted] = []
        stats = self.speculative_stats
        for row, chunk in drafted:
            seq, k = chunk.seq, chunk.num_draft
            verdict = verify(seq.draft_ids[:k], greedy[row : row + k + 1])
            stats.steps += 1
            stats.drafted += k
            stats.accepted += verdict.accepted
            seq.draft_limit = next_draft_limit(
                seq.draft_limit, k, verdict.accepted, self.speculative.num_tokens
            )
            state = self._states[seq.request_id]
            for token in verdict.tokens:
                emitted.append(Emitted(seq.request_id, state.append(token, None, now)))
                stats.emitted += 1
                if state.finished:
                    break
            if state.finished:
                del self._states[seq.request_id]
                self.scheduler.finish(seq)
            else:  # K/V of the accepted drafts is valid; the rest is overwritten next step
                seq.num_computed_tokens += verdict.accepted
                self.block_manager.cache_full_blocks(seq)
        return emitted

    def load(self) -> LoadSnapshot:
        scheduler, manager = self.scheduler, self.block_manager
        return LoadSnapshot(
            num_waiting=len(scheduler.waiting),
            num_running=len(scheduler.running),
            kv_blocks_total=manager.num_blocks,
            kv_blocks_free=manager.num_free_blocks,
            kv_cache_usage=manager.usage,
            waiting_prompt_tokens=sum(s.num_uncomputed_tokens for s in scheduler.waiting),
            running_remaining_tokens=sum(
                s.max_completion_tokens - s.num_completion_tokens for s in scheduler.running
            ),
            tokens_per_second=self._tokens_per_second(time.perf_counter()),
            prefix_cache_hit_rate=manager.hit_rate,
            max_num_seqs=self.config.max_num_seqs,
        )

    def info(self) -> EngineInfo:
        dtype = "int8" if self.config.quantization == "int8" else self.config.dtype
        return EngineInfo(
            model=self.model_name,
            backend="torch",
            dtype=dtype,
            device=str(self.runner.device),
            max_context=self.max_context,
            kv_block_size=self.config.kv_block_size,
            kv_blocks_total=self.block_manager.num_blocks,
            max_num_seqs=self.config.max_num_seqs,
            max_batched_tokens=self.config.max_batched_tokens,
        )

    def _record_throughput(self, now: float, tokens: int) -> None:
        self._produced.append((now, tokens))
        while self._produced and now - self._produced[0][0] > THROUGHPUT_WINDOW_S:
            self._produced.popleft()

    def _tokens_per_second(self, now: float) -> float:
        recent = [n for t, n in self._produced if now - t <= THROUGHPUT_WINDOW_S]
        return sum(recent) / THROUGHPUT_WINDOW_S if recent else 0.0


def split_rows(
    sampled: Seq[ScheduledChunk],
) -> tuple[list[tuple[int, ScheduledChunk]], list[tuple[int, ScheduledChunk]]]:
    """(first logits row, chunk) of the plain chunks and of those with drafts to verify."""
    plain: list[tuple[int, ScheduledChunk]] = []
    drafted: list[tuple[int, ScheduledChunk]] = []
    row = 0
    for chunk in sampled:
        (drafted if chunk.num_draft else plain).append((row, chunk))
        row += 1 + chunk.num_draft
    return plain, drafted


def load_tokenizer(path: Path) -> Decoder | None:
    """The checkpoint's tokenizer.json, or None when it has none."""
    file = path / "tokenizer.json"
    if not file.is_file():
        return None
    try:
        tokenizer: Decoder = Tokenizer.from_file(str(file))
    except Exception as exc:  # the tokenizers library raises plain Exception subclasses
        raise CheckpointError(f"tokenizer.json: cannot load ({exc})") from exc
    return tokenizer


def _max_context(model_config: ModelConfig, config: EngineConfig, num_blocks: int | None) -> int:
    """Context limit: the configured or trained length, the sliding window, and the KV capacity."""
    limit = config.max_context or model_config.max_position_embeddings
    if model_config.sliding_window is not None:
        # Attention here is full; capping at the window keeps it exact for sliding-window models.
        limit = min(limit, model_config.sliding_window)
    if num_blocks is not None:
        limit = min(limit, num_blocks * config.kv_block_size)
    return limit
