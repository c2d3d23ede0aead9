"""The semantic engine: one worker thread owns the encoder and the vector index; concurrent
requests are embedded together in one forward pass."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from llm_cache import guard
from llm_cache.encoder import Encoder
from llm_cache.index import Candidate, Vector, VectorIndex
from llm_cache.verifier import Verifier
from llm_common.bounded_map import BoundedTTLMap

T = TypeVar("T")
_RECENT_EMBEDDINGS = 4096  # a Store right after a missed Lookup reuses its embedding


@dataclass(frozen=True, slots=True)
class Embedding:
    """A prompt's vector and guard features. `vector` is None when the prompt is longer than
    the encoder reads: its tail would be invisible, so it never matches semantically."""

    vector: Vector | None
    features: guard.Features
    tokens: bytes = b""  # the verifier's word pieces (uint16), empty without a verifier


@dataclass(frozen=True, slots=True)
class Search:
    """The query's embedding and the nearest entries at or above the threshold."""

    embedding: Embedding
    candidates: tuple[Candidate, ...]


@dataclass(frozen=True, slots=True)
class IndexItem:
    """One entry to index."""

    namespace: str
    entry_id: str
    vector: Vector
    text: str


@dataclass(slots=True)
class _Job:
    text: str
    namespace: str | None  # None: embed only
    k: int
    min_similarity: float
    future: asyncio.Future[Search]
    verify: int | None = None  # candidates the verifier scores (nearest first); None: all


class SemanticEngine:
    """Embedding and nearest-neighbour search off the event loop.

    A single worker thread runs every encoder call and every index read or write, so the
    index needs no lock and searches never see a half-applied update. Jobs that arrive while
    a batch runs are embedded together in the next one (up to `max_batch`).
    """

    def __init__(
        self,
        encoder: Encoder,
        index: VectorIndex,
        *,
        max_batch: int,
        verifier: Verifier | None = None,
    ) -> None:
        self._encoder = encoder
        self._index = index
        self._verifier = verifier
        self._max_batch = max_batch
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="semantic")
        self._queue: asyncio.Queue[_Job] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        self._recent: BoundedTTLMap[str, Embedding] = BoundedTTLMap(_RECENT_EMBEDDINGS)

    def __contains__(self, entry_id: object) -> bool:
        return entry_id in self._index  # a dict lookup: safe outside the worker

    @property
    def dim(self) -> int:
        return self._encoder.dim

    @property
    def indexed(self) -> int:
        """Vectors in the index (read without the worker: a dict length is atomic)."""
        return len(self._index)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="semantic-batcher")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self._executor.shutdown(wait=True, cancel_futures=True)

    async def embed(self, text: str) -> Embedding:
        """The embedding of `text` (batched with concurrent requests)."""
        return (await self._submit(text, None, 0, 1.0)).embedding

    async def search(
        self, namespace: str, text: str, k: int, min_similarity: float, verify: int | None = None
    ) -> Search | None:
        """Embed `text` and find up to k entries of `namespace` at or above `min_similarity`,
        the nearest `verify` of them (None: all) scored by the verifier when there is one;
        None, without embedding anything, when the namespace is empty (a new conversation
        context, say): most of the cost of a semantic miss is the encoder."""
        if not self._index.has_namespace(namespace):  # a dict lookup: safe outside the worker
            return None
        return await self._submit(text, namespace, k, min_similarity, verify)

    async def put(self, items: Sequence[IndexItem]) -> int:
        """Index entries (features are extracted in the worker); returns how many fit."""
        return await self._in_worker(self._put, items)

    async def remove(self, entry_ids: Iterable[str]) -> int:
        """Drop entries from the index; returns how many were indexed."""
        ids = list(entry_ids)
        if not ids:
            return 0
        return await self._in_worker(lambda: sum(self._index.remove(i) for i in ids))

    async def clear(self) -> None:
        await self._in_worker(self._index.clear)

    async def _submit(
        self, text: str, namespace: str | None, k: int, threshold: float, verify: int | None = None
    ) -> Search:
        if self._task is None:
            raise RuntimeError("SemanticEngine.start() was not called")
        future: asyncio.Future[Search] = asyncio.get_running_loop().create_future()
        await self._queue.put(_Job(text, namespace, k, threshold, future, verify))
        return await future

    async def _in_worker(self, fn: Callable[..., T], *args: object) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, fn, *args)

    async def _run(self) -> None:
        while True:
            batch = [await self._queue.get()]
            while len(batch) < self._max_batch and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            live = [job for job in batch if not job.future.done()]  # drop cancelled callers
            if not live:
                continue
            try:
                results = await self._in_worker(self._process, live)
            except Exception as exc:  # an encoder failure fails this batch, not the engine
                for job in live:
                    if not job.future.done():
                        job.future.set_exception(exc)
                continue
            for job, result in zip(live, results, strict=True):
                if not job.future.done():
                    job.future.set_result(result)

    @property
    def verifier(self) -> Verifier | None:
        return self._verifier

    def _process(self, jobs: list[_Job]) -> list[Search]:
        embeddings = self._embed_all([job.text for job in jobs])
        searches = [self._search_one(job, embeddings[job.text]) for job in jobs]
        return self._verify(searches, [job.verify for job in jobs])

    def _verify(self, searches: list[Search], verify: list[int | None]) -> list[Search]:
        """Scores the nearest `verify` candidates of every search of the batch in one
        verifier pass: only candidates at or above the search's floor reach it, so a miss
        costs nothing here."""
        if self._verifier is None:
            return searches
        chosen = [
            [i for i, c in enumerate(s.candidates) if c.tokens and s.embedding.tokens][:n]
            for s, n in zip(searches, verify, strict=True)
        ]
        pairs = [
            (s.candidates[i].tokens, s.embedding.tokens)
            for s, rows in zip(searches, chosen, strict=True)
            for i in rows
        ]
        if not pairs:
            return searches
        scores = iter(self._verifier.score_bytes(pairs).tolist())
        out = []
        for s, rows in zip(searches, chosen, strict=True):
            scored = {i: next(scores) for i in rows}
            out.append(dataclasses.replace(s, candidates=tuple(
                dataclasses.replace(c, verified=scored[i]) if i in scored else c
                for i, c in enumerate(s.candidates)
            )))  # fmt: skip
        return out

    def _search_one(self, job: _Job, embedding: Embedding) -> Search:
        if job.namespace is None or embedding.vector is None:
            return Search(embedding, ())
        found = self._index.search(job.namespace, embedding.vector, job.k, job.min_similarity)
        return Search(embedding, tuple(found))

    def _embed_all(self, texts: list[str]) -> dict[str, Embedding]:
        result = {t: e for t in texts if (e := self._recent.peek(t)) is not None}
        todo = list(dict.fromkeys(t for t in texts if t not in result))
        if todo:
            encoded = self._encoder.encode(todo)
            tokens = self._tokens(todo)
            for i, text in enumerate(todo):
                vector = None if encoded.truncated[i] else np.ascontiguousarray(encoded.vectors[i])
                result[text] = Embedding(vector, guard.extract(text), tokens[i])
        for text, embedding in result.items():
            self._recent.put(text, embedding)
        return result

    def _tokens(self, texts: list[str]) -> list[bytes]:
        if self._verifier is None:
            return [b""] * len(texts)
        return self._verifier.token_bytes(texts)

    def _put(self, items: Sequence[IndexItem]) -> int:
        tokens = self._tokens([i.text for i in items])
        return sum(
            self._index.put(i.namespace, i.entry_id, i.vector, guard.extract(i.text), t)
            for i, t in zip(items, tokens, strict=True)
        )
