"""Output formats -> xgrammar grammars: request checks, compilation off the step loop, a cache.

`GrammarCache.compile(spec)` (blocking) and `await GrammarCache.compile_async(spec)` return a
`CompiledFormat`. Compilation runs on the cache's own worker thread, never on the event loop or
the engine thread; requests with the same spec (sha256 of its canonical form) share one
compilation, in flight or done, and the last `capacity` results are kept (LRU by count; a
failed compilation is kept too, so a bad spec sent again fails fast). The tokenizer side
(xgrammar.TokenizerInfo from tokenizer.json, sized to the model's logits, the model's EOS as stop
tokens) is built on first use, or ahead of it with `warm_up()`.

Kinds: json_object -> any JSON object; json_schema -> the schema (checked first by
schema_check, which names what xgrammar would not enforce, then restated by schema_rewrite
where xgrammar gets a keyword wrong); regex; grammar (EBNF, root rule
`root`); choice -> an EBNF alternation of the literal values; tagged_json -> begin + JSON(schema)
+ end, 1..max_items times with the separator between (an xgrammar structural tag, so the schema
is compiled once). JSON may have whitespace between tokens, at most JSON_WHITESPACE characters in
a row (a model cannot loop on whitespace); properties come in schema order; objects take no
properties beyond those declared unless the schema allows them.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import re
import threading
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llm_common.bounded_map import BoundedTTLMap

from .api import EngineError, FormatKind, InvalidRequest, OutputFormatSpec, SamplingOptions
from .schema_check import check_schema
from .schema_rewrite import enforceable

if TYPE_CHECKING:
    import xgrammar as xgr

log = logging.getLogger(__name__)

MAX_SPEC_BYTES = 64 * 1024  # a JSON schema, regex or grammar
MAX_CHOICES = 256
MAX_CHOICE_BYTES = 1024
MAX_TAG_BYTES = 1024  # tagged_json begin, end and separator
MAX_TAGGED_ITEMS = 64
JSON_WHITESPACE = 16  # most whitespace characters in a row between JSON tokens
CACHE_CAPACITY = 256
RECENT_SAMPLES = 256
NO_TOKENIZER = "constrained decoding needs the model's tokenizer (tokenizer.json)"
NO_EOS = "constrained decoding needs the model's end-of-sequence token (eos_token_id)"
_ANY_OBJECT = '{"type": "object"}'
_LOG_PREFIX = re.compile(r"^\[[0-9:]+\] \S+:\d+: ")


@dataclass(frozen=True, slots=True)
class CompiledFormat:
    """A compiled output format, shared by every request with the same spec."""

    digest: str
    kind: FormatKind
    grammar: xgr.CompiledGrammar
    compile_ms: float  # the compilation itself, without waiting for the worker


@dataclass(slots=True)
class CompileStats:
    """Counters for metrics and benchmarks (read without locking: approximate is fine)."""

    hits: int = 0  # served from the cache or joined a compilation in flight
    misses: int = 0
    setup_ms: float = 0.0  # building the tokenizer info and compiler (first use)
    compile_ms: deque[float] = field(default_factory=lambda: deque(maxlen=RECENT_SAMPLES))


def spec_field(spec: OutputFormatSpec) -> str:
    """The request field a problem with `spec` is reported against."""
    names = {
        FormatKind.CHOICE: "choice.values",
        FormatKind.TAGGED_JSON: "tagged_json.json_schema",
    }
    return f"sampling.format.{names.get(spec.kind, spec.kind.value)}"


def check_options(sampling: SamplingOptions) -> None:
    """Sampling options that cannot go with an output format."""
    if sampling.output_format is not None and sampling.ignore_eos:
        raise InvalidRequest(
            "ignore_eos cannot be combined with an output format: the format decides where "
            "the output ends",
            "sampling.ignore_eos",
        )


def check_spec(spec: OutputFormatSpec) -> None:
    """Size limits (cheap, before hashing); InvalidRequest names the field at fault."""
    where = spec_field(spec)
    if _utf8_len(spec.spec) > MAX_SPEC_BYTES:
        raise InvalidRequest(f"must be at most {MAX_SPEC_BYTES} bytes", where)
    if (
        spec.kind in (FormatKind.JSON_SCHEMA, FormatKind.REGEX, FormatKind.GRAMMAR)
        and not spec.spec
    ):
        raise InvalidRequest("must not be empty", where)
    if spec.kind is FormatKind.CHOICE:
        if not 1 <= len(spec.choices) <= MAX_CHOICES:
            raise InvalidRequest(f"must have 1-{MAX_CHOICES} values", where)
        if any(not 1 <= _utf8_len(c) <= MAX_CHOICE_BYTES for c in spec.choices):
            raise InvalidRequest(f"each value must be 1-{MAX_CHOICE_BYTES} bytes", where)
    if spec.kind is FormatKind.TAGGED_JSON:
        for name in ("begin", "end", "separator"):
            if _utf8_len(getattr(spec, name)) > MAX_TAG_BYTES:
                raise InvalidRequest(
                    f"must be at most {MAX_TAG_BYTES} bytes", f"sampling.format.tagged_json.{name}"
                )
        if not 0 <= spec.max_items <= MAX_TAGGED_ITEMS:
            raise InvalidRequest(
                f"must be in [0, {MAX_TAGGED_ITEMS}]", "sampling.format.tagged_json.max_items"
            )


def spec_digest(spec: OutputFormatSpec) -> str:
    """sha256 of the spec's canonical form (what the cache is keyed by)."""
    canonical = [
        spec.kind.value,
        spec.spec,
        list(spec.choices),
        spec.begin,
        spec.end,
        spec.separator,
        max(spec.max_items, 1),
    ]
    return hashlib.sha256(json.dumps(canonical).encode()).hexdigest()


class GrammarCache:
    """Compiles output formats on one worker thread and keeps the recent results."""

    def __init__(
        self,
        tokenizer_file: Path | None,
        *,
        vocab_size: int,
        stop_token_ids: Sequence[int],
        capacity: int = CACHE_CAPACITY,
        compile_threads: int = 1,
    ) -> None:
        self.tokenizer_file = tokenizer_file
        self.vocab_size = vocab_size
        self.stop_token_ids = tuple(stop_token_ids)
        self.capacity = capacity
        self.compile_threads = compile_threads
        self.stats = CompileStats()
        self._lock = threading.Lock()
        self._entries: BoundedTTLMap[str, Future[CompiledFormat]] = BoundedTTLMap(capacity)
        self._executor: ThreadPoolExecutor | None = None
        self._compiler: xgr.GrammarCompiler | None = None  # worker thread only

    def submit(self, spec: OutputFormatSpec) -> Future[CompiledFormat]:
        """The compilation of `spec`: cached, in flight, or started now on the worker."""
        check_spec(spec)
        digest = spec_digest(spec)
        with self._lock:
            future = self._entries.get(digest)
            if future is not None and not future.cancelled():
                self.stats.hits += 1
                return future
            self.stats.misses += 1
            future = self._pool().submit(self._build, spec, digest)
            self._entries.put(digest, future)
        future.add_done_callback(lambda done: self._drop_if_broken(digest, done))
        return future

    def compile(self, spec: OutputFormatSpec) -> CompiledFormat:
        """Blocking compile (tests, benchmarks, the synchronous core); InvalidRequest if bad."""
        return self.submit(spec).result()

    async def compile_async(self, spec: OutputFormatSpec) -> CompiledFormat:
        """Compile without blocking the event loop; cancelling the caller leaves the shared
        compilation running for the others waiting on it."""
        return await asyncio.shield(asyncio.wrap_future(self.submit(spec)))

    def warm_up(self) -> None:
        """Build the tokenizer info in the background, so the first request does not wait."""
        if self.tokenizer_file is not None and self.stop_token_ids:
            with self._lock:
                self._pool().submit(self._compiler_or_fail)

    def close(self) -> None:
        """Stop the worker (a later submit starts a new one); compiled grammars stay cached."""
        with self._lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=True)

    @property
    def size(self) -> int:
        """Compilations cached or in flight."""
        return len(self._entries)

    def _pool(self) -> ThreadPoolExecutor:  # with the lock held
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="grammar-compile")
        return self._executor

    def _drop_if_broken(self, digest: str, future: Future[CompiledFormat]) -> None:
        # Bad specs stay cached (they fail the same way again); anything else is retried.
        if future.cancelled() or not isinstance(future.exception(), InvalidRequest | None):
            with self._lock:
                if self._entries.peek(digest) is future:
                    self._entries.pop(digest)

    def _build(self, spec: OutputFormatSpec, digest: str) -> CompiledFormat:
        try:
            compiler = self._compiler_or_fail()
            start = time.perf_counter()
            grammar = compile_spec(compiler, spec)
        except InvalidRequest:
            raise
        except Exception as exc:  # a failure of ours, not the caller's: retryable, never INTERNAL
            log.exception("compiling an output format failed")
            raise EngineError(f"cannot compile the output format: {exc}") from exc
        elapsed_ms = (time.perf_counter() - start) * 1e3
        self.stats.compile_ms.append(elapsed_ms)
        return CompiledFormat(digest, spec.kind, grammar, elapsed_ms)

    def _compiler_or_fail(self) -> xgr.GrammarCompiler:
        if self.tokenizer_file is None:
            raise InvalidRequest(NO_TOKENIZER, "sampling.format")
        if not self.stop_token_ids:
            raise InvalidRequest(NO_EOS, "sampling.format")
        if self._compiler is None:
            import xgrammar as xgr  # deferred: importing it costs ~0.5 s

            start = time.perf_counter()
            info = tokenizer_info(self.tokenizer_file, self.vocab_size, self.stop_token_ids)
            # Our LRU is the cache; xgrammar's own would grow without bound.
            self._compiler = xgr.GrammarCompiler(
                info, max_threads=self.compile_threads, cache_enabled=False
            )
            self.stats.setup_ms = (time.perf_counter() - start) * 1e3
        return self._compiler


def tokenizer_info(
    tokenizer_file: Path, vocab_size: int, stop_token_ids: Sequence[int]
) -> xgr.TokenizerInfo:
    """xgrammar's view of the vocabulary, from tokenizer.json alone (no transformers).

    Rows past the tokenizer (padded logits) and special added tokens get no text, so no
    grammar can emit them; the EOS ids are the stop tokens. Equivalent to
    TokenizerInfo.from_huggingface(PreTrainedTokenizerFast(...)) apart from the special tokens.
    """
    import xgrammar as xgr
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_file))
    special = {t.content for t in tokenizer.get_added_tokens_decoder().values() if t.special}
    encoded = [""] * vocab_size
    for text, token_id in tokenizer.get_vocab(with_added_tokens=True).items():
        if token_id < vocab_size and text not in special:
            encoded[token_id] = text
    metadata = xgr.TokenizerInfo._detect_metadata_from_hf(tokenizer.to_str())
    return xgr.TokenizerInfo(
        encoded,
        metadata["vocab_type"],
        vocab_size=vocab_size,
        stop_token_ids=list(stop_token_ids),
        add_prefix_space=bool(metadata["add_prefix_space"]),
    )


def compile_spec(compiler: xgr.GrammarCompiler, spec: OutputFormatSpec) -> xgr.CompiledGrammar:
    """Compile one spec; InvalidRequest (with the spec's field) for anything xgrammar rejects."""
    where = spec_field(spec)
    try:
        grammar = _compile(compiler, spec, where)
    except (RuntimeError, ValueError) as exc:  # xgrammar's input errors are RuntimeErrors
        raise InvalidRequest(f"cannot compile: {_clean(exc)}", where) from None
    if not _admits_output(grammar):
        raise InvalidRequest("no output can match this format", where)
    return grammar


def _compile(
    compiler: xgr.GrammarCompiler, spec: OutputFormatSpec, where: str
) -> xgr.CompiledGrammar:
    kind = spec.kind
    if kind is FormatKind.JSON_OBJECT:
        return compiler.compile_json_schema(
            _ANY_OBJECT, strict_mode=False, max_whitespace_cnt=JSON_WHITESPACE
        )
    if kind is FormatKind.JSON_SCHEMA:
        schema = json.dumps(_load_schema(spec.spec, where))
        return compiler.compile_json_schema(schema, max_whitespace_cnt=JSON_WHITESPACE)
    if kind is FormatKind.REGEX:
        return compiler.compile_regex(spec.spec)
    if kind is FormatKind.GRAMMAR:
        return compiler.compile_grammar(spec.spec, root_rule_name="root")
    if kind is FormatKind.CHOICE:
        return compiler.compile_grammar(choice_ebnf(spec.choices))
    schema = _load_schema(spec.spec, where) if spec.spec else json.loads(_ANY_OBJECT)
    return compiler.compile_structural_tag(tagged_json_tag(spec, schema))


def choice_ebnf(choices: Sequence[str]) -> str:
    """`root ::= "a" | "b" ...` (JSON string escapes are valid EBNF literals)."""
    literals = dict.fromkeys(json.dumps(c, ensure_ascii=False) for c in choices)
    return "root ::= " + " | ".join(literals)


def tagged_json_tag(spec: OutputFormatSpec, schema: Any) -> str:
    """The structural tag: item (sep item){0, max_items - 1}, item = begin JSON end."""
    content = {"type": "json_schema", "json_schema": schema, "max_whitespace_cnt": JSON_WHITESPACE}
    item = _sequence([_literal(spec.begin), content, _literal(spec.end)])
    count = max(spec.max_items, 1)
    if count > 1:
        more = _sequence([_literal(spec.separator), item])
        item = _sequence([item, {"type": "repeat", "min": 0, "max": count - 1, "content": more}])
    return json.dumps({"type": "structural_tag", "format": item})


def _literal(text: str) -> dict[str, Any] | None:
    return {"type": "const_string", "value": text} if text else None


def _sequence(parts: list[dict[str, Any] | None]) -> dict[str, Any]:
    present = [p for p in parts if p is not None]
    return present[0] if len(present) == 1 else {"type": "sequence", "elements": present}


def _load_schema(text: str, where: str) -> Any:
    try:
        schema = json.loads(text)
    except RecursionError:
        raise InvalidRequest("JSON nests too deeply", where) from None
    except ValueError as exc:
        raise InvalidRequest(f"invalid JSON: {exc}", where) from None
    check_schema(schema, where)
    return enforceable(schema)


def _admits_output(grammar: xgr.CompiledGrammar) -> bool:
    """Whether any first token (EOS included) is allowed: catches formats matching nothing."""
    import xgrammar as xgr

    info = grammar.tokenizer_info
    bitmask = xgr.allocate_token_bitmask(1, info.vocab_size)
    bitmask.zero_()
    xgr.GrammarMatcher(grammar).fill_next_token_bitmask(bitmask, 0)
    return bool(bitmask.any())


def _clean(exc: Exception) -> str:
    """xgrammar's message without its log prefix ('[12:00:00] /project/cpp/x.cc:12: ')."""
    text = " ".join(_LOG_PREFIX.sub("", str(exc)).split())
    return text[:300] or type(exc).__name__


def _utf8_len(text: str) -> int:
    return len(text.encode("utf-8", errors="surrogatepass"))
