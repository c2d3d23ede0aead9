"""CacheService over a real grpc.aio server on port 0, real Redis and the real encoder."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import grpc
import pytest
import redis.asyncio

from llm_common.errors import parse_error
from llmapi.cache.v1 import cache_service_pb2 as pb
from llmapi.common.v1 import common_pb2

pytestmark = pytest.mark.integration

S, U, A = common_pb2.ROLE_SYSTEM, common_pb2.ROLE_USER, common_pb2.ROLE_ASSISTANT


async def test_exact_hit_replays_the_whole_response(served, req) -> None:
    key = req.key("Name the largest planet.", max_tokens=64, stop=["\n"])
    stored = await served.stub.Store(req.store(key, "Jupiter."))
    assert stored.stored
    assert len(stored.entry_id) == 32

    found = await served.stub.Lookup(req.lookup(key))

    assert found.kind == pb.HIT_KIND_EXACT
    assert found.similarity == pytest.approx(1.0)
    assert found.entry_id == stored.entry_id
    assert found.response.text == "Jupiter."
    assert list(found.response.token_ids) == [10, 11]
    assert found.response.finish_reason == common_pb2.FINISH_REASON_STOP
    assert found.response.usage.total_tokens == 14
    assert found.response.created_at.seconds > 0


async def test_token_ids_and_completion_prompts_are_exact_keys(served, req) -> None:
    ids_key = req.key(ids=[5, 6, 7])
    prompt_key = req.key(prompt="Once upon a time")
    await served.stub.Store(req.store(ids_key, "by ids"))
    await served.stub.Store(req.store(prompt_key, "by prompt"))

    assert (await served.stub.Lookup(req.lookup(ids_key))).response.text == "by ids"
    assert (await served.stub.Lookup(req.lookup(prompt_key))).response.text == "by prompt"
    other_ids = await served.stub.Lookup(req.lookup(req.key(ids=[5, 6, 8])))
    assert other_ids.kind == pb.HIT_KIND_MISS


async def test_tenants_never_see_each_others_entries(served, req) -> None:
    text = "What is the boiling point of water at sea level?"
    await served.stub.Store(req.store(req.key(text, tenant="tenant-a"), "100 C"))

    exact = await served.stub.Lookup(req.lookup(req.key(text, tenant="tenant-b")))
    paraphrase = req.key("At sea level, what's the boiling point of water?", tenant="tenant-b")
    semantic = await served.stub.Lookup(req.lookup(paraphrase, threshold=0.5))

    assert exact.kind == pb.HIT_KIND_MISS
    assert semantic.kind == pb.HIT_KIND_MISS
    own = await served.stub.Lookup(req.lookup(req.key(text, tenant="tenant-a")))
    assert own.kind == pb.HIT_KIND_EXACT


@pytest.mark.parametrize(
    ("stored_params", "other_params"),
    [
        ({"temperature": 0.0}, {"temperature": 0.0, "max_tokens": 16}),
        ({"temperature": 0.0}, {"temperature": 0.0, "stop": ["."]}),
        ({"temperature": 0.0}, {"temperature": 0.0, "stop_token_ids": [1]}),
        ({"temperature": 0.0}, {"temperature": 0.0, "ignore_eos": True}),
        ({"temperature": 0.7, "seed": 1}, {"temperature": 0.7, "seed": 2}),
        ({"temperature": 0.7, "seed": 1}, {"temperature": 0.8, "seed": 1}),
        ({"temperature": 0.7, "seed": 1}, {"temperature": 0.7, "seed": 1, "top_p": 0.9}),
        ({"temperature": 0.7, "seed": 1}, {"temperature": 0.7, "seed": 1, "top_k": 5}),
    ],
)
async def test_different_output_parameters_never_share_an_entry(
    served, req, stored_params, other_params
) -> None:
    text = "Write one word about the sea."
    await served.stub.Store(req.store(req.key(text, **stored_params), "Waves"))

    other = req.key(text, **other_params)
    found = await served.stub.Lookup(req.lookup(other))

    assert found.kind == pb.HIT_KIND_MISS
    assert (await served.stub.Lookup(req.lookup(req.key(text, **stored_params)))).kind == (
        pb.HIT_KIND_EXACT
    )


async def test_semantic_hits_stay_within_the_parameter_class(served, req) -> None:
    await served.stub.Store(req.store(req.key("How can I learn to play the guitar quickly?")))
    paraphrase = "What is the quickest way to learn to play the guitar?"

    other_class = await served.stub.Lookup(
        req.lookup(req.key(paraphrase, max_tokens=32), threshold=0.7)
    )
    same_class = await served.stub.Lookup(req.lookup(req.key(paraphrase), threshold=0.7))

    assert other_class.kind == pb.HIT_KIND_MISS
    assert same_class.kind == pb.HIT_KIND_SEMANTIC


async def test_greedy_requests_ignore_sampling_knobs(served, req) -> None:
    text = "Say hi."
    await served.stub.Store(req.store(req.key(text, top_p=0.5, top_k=3, seed=9), "hi"))

    found = await served.stub.Lookup(req.lookup(req.key(text, top_p=1.0, top_k=0)))

    assert found.kind == pb.HIT_KIND_EXACT  # temperature 0: top_p/top_k/seed change nothing


async def test_nondeterministic_requests_are_cached_only_on_opt_in(served, req) -> None:
    key = req.key("Tell me a joke.", temperature=1.0)

    refused = await served.stub.Store(req.store(key))
    assert not refused.stored
    assert refused.reason == "nondeterministic"
    miss = await served.stub.Lookup(req.lookup(key))
    assert miss.reason == "nondeterministic"

    assert (await served.stub.Store(req.store(key, allow_nondeterministic=True))).stored
    found = await served.stub.Lookup(req.lookup(key, allow_nondeterministic=True))
    assert found.kind == pb.HIT_KIND_EXACT


async def test_incomplete_and_logprob_responses_are_not_stored(served, req) -> None:
    cancelled = req.store(req.key("Count to ten."))
    cancelled.response.finish_reason = common_pb2.FINISH_REASON_CANCELLED
    logprobs = req.store(req.key("Count to five.", logprobs=True))

    assert (await served.stub.Store(cancelled)).reason == "incomplete"
    assert (await served.stub.Store(logprobs)).reason == "uncacheable"


async def test_entries_expire_after_their_ttl(served, req) -> None:
    key = req.key("What day is it?")
    await served.stub.Store(req.store(key, ttl_seconds=1))
    assert (await served.stub.Lookup(req.lookup(key))).kind == pb.HIT_KIND_EXACT

    await asyncio.sleep(1.2)

    expired = await served.stub.Lookup(req.lookup(key))
    assert expired.kind == pb.HIT_KIND_MISS
    stats = await served.stub.Stats(pb.StatsRequest(tenant_id="tenant-a"))
    assert stats.entries == 0  # the accounting is swept too
    assert stats.bytes == 0


async def test_eviction_keeps_each_tenant_within_its_byte_budget(
    make_settings, serve_cache, req, redis_client: redis.asyncio.Redis
) -> None:
    budget = 48 * 1024
    settings = make_settings(tenant_budget_bytes=budget, max_entry_bytes=8 * 1024)
    async with serve_cache(settings) as served:
        keys = [req.key(f"Question number {i} about budgets", ids=[i, 1, 2]) for i in range(60)]
        evicted = 0
        for i, key in enumerate(keys):
            result = await served.stub.Store(req.store(key, "x" * 2000))
            evicted += result.evicted
            if i == 5:  # keep entry 0 recently used: LRU spares it
                await served.stub.Lookup(req.lookup(keys[0]))
            stats = await served.stub.Stats(pb.StatsRequest(tenant_id="tenant-a"))
            assert stats.bytes <= budget

        assert evicted > 0
        assert stats.evictions == evicted
        assert stats.entries == 60 - evicted
        live = [(await served.stub.Lookup(req.lookup(k))).kind == pb.HIT_KIND_EXACT for k in keys]
        assert live[-1]
        assert not live[1]  # least recently used went first
        # The accounted bytes match what the live entries were charged.
        sizes = await redis_client.hvals(served.app.store.keys("tenant-a").accounting[0])
        assert sum(int(v.split(b":")[0]) for v in sizes) == stats.bytes


async def test_an_entry_larger_than_the_limit_is_refused(make_settings, serve_cache, req) -> None:
    async with serve_cache(make_settings(max_entry_bytes=4096)) as served:
        result = await served.stub.Store(req.store(req.key("Long answer"), "y" * 5000))
        assert not result.stored
        assert result.reason == "too_large"


async def test_a_paraphrase_gets_a_semantic_hit(served, req) -> None:
    await served.stub.Store(req.store(req.key("How can I learn to play the guitar quickly?")))

    found = await served.stub.Lookup(
        req.lookup(req.key("What is the quickest way to learn to play the guitar?"), threshold=0.7)
    )

    assert found.kind == pb.HIT_KIND_SEMANTIC
    assert 0.7 <= found.similarity < 1.0
    assert found.response.text == "Paris."


@pytest.mark.parametrize(("margin", "expected"), [(0.2, "guard_similarity"), (0.0, "")])
async def test_two_questions_need_the_question_margin(
    make_settings, serve_cache, req, margin: float, expected: str
) -> None:
    settings = make_settings(question_margin=margin, verifier="off")  # the rule guard's margin
    async with serve_cache(settings) as served:
        await served.stub.Store(req.store(req.key("How can I learn to play the guitar quickly?")))
        found = await served.stub.Lookup(
            req.lookup(req.key("What is the fastest way to learn guitar?"), threshold=0.75)
        )
        stats = await served.stub.Stats(pb.StatsRequest(tenant_id="tenant-a"))

    # The pair's similarity is about 0.9: above 0.75, below 0.75 + 0.2.
    assert found.reason == expected
    assert (found.kind == pb.HIT_KIND_SEMANTIC) == (not expected)
    assert stats.guard_rejections == (1 if expected else 0)


async def test_semantic_lookup_is_opt_in_and_threshold_overridable(served, req) -> None:
    await served.stub.Store(req.store(req.key("How can I learn to play the guitar quickly?")))
    paraphrase = req.key("What is the fastest way to learn guitar?")

    off = await served.stub.Lookup(req.lookup(paraphrase, semantic=False))
    strict = await served.stub.Lookup(req.lookup(paraphrase, threshold=0.99))

    assert off.kind == pb.HIT_KIND_MISS
    assert strict.kind == pb.HIT_KIND_MISS


@pytest.mark.parametrize(
    ("stored", "query", "check"),
    [
        ("Is it safe to eat raw eggs?", "Is it not safe to eat raw eggs?", "negation"),
        ("How do I get a refund?", "How do I never get a refund?", "negation"),
        ("What was the GDP of France in 2019?", "What was the GDP of France in 2020?", "number"),
        ("How long does it take to walk 5 km?", "How long does it take to walk 50 km?", "number"),
        ("How do I convert Celsius to Fahrenheit?", "How do I convert Fahrenheit to Celsius?",
         "direction"),
        ("How can I increase my credit score?", "How can I decrease my credit score?",
         "direction"),
        ("Which is a good rehab in Clay County?", "Which is a good rehab in Union County?",
         "entity"),
    ],
)  # fmt: skip
async def test_negated_changed_or_reversed_prompts_do_not_hit(
    make_settings, serve_cache, req, stored, query, check
) -> None:
    async with serve_cache(make_settings(verifier="off")) as served:  # the rule guard alone
        await served.stub.Store(req.store(req.key(stored)))
        found = await served.stub.Lookup(req.lookup(req.key(query), threshold=0.5))
        stats = await served.stub.Stats(pb.StatsRequest(tenant_id="tenant-a"))

    assert found.kind == pb.HIT_KIND_MISS
    assert found.reason == f"guard_{check}"
    assert stats.guard_rejections >= 1


@pytest.mark.parametrize(
    ("stored", "query", "reasons"),
    [
        ("Is it safe to eat raw eggs?", "Is it not safe to eat raw eggs?", {"guard_negation"}),
        ("What was the GDP of France in 2019?", "What was the GDP of France in 2020?",
         {"guard_number"}),
        ("Is Rome older than Athens?", "Is Athens older than Rome?",
         {"guard_direction", "guard_verifier"}),
        ("Summarise the history of jazz as a table.", "Summarise the history of jazz as a poem.",
         {"guard_verifier", "guard_similarity"}),
        ("How do I archive a Slack channel?", "How do I delete a Slack channel?",
         {"guard_verifier", "guard_similarity"}),
    ],
)  # fmt: skip
async def test_the_verifier_refuses_near_misses(
    make_settings, serve_cache, req, stored, query, reasons
) -> None:
    async with serve_cache(make_settings(verifier="balanced")) as served:
        await served.stub.Store(req.store(req.key(stored)))
        found = await served.stub.Lookup(req.lookup(req.key(query), threshold=0.5))

    assert found.kind == pb.HIT_KIND_MISS
    assert found.reason in reasons


async def test_each_tenant_gets_its_own_mode(make_settings, serve_cache, req) -> None:
    settings = make_settings(question_margin=0.25, verifier_tenants=(("tenant-a", "balanced"),))
    stored, query = (
        "How do I learn to swim as an adult?",
        "How can I learn to swim as an adult?",
    )
    async with serve_cache(settings) as served:
        for tenant in ("tenant-a", "tenant-b"):
            await served.stub.Store(req.store(req.key(stored, tenant=tenant)))
        found = {
            t: await served.stub.Lookup(req.lookup(req.key(query, tenant=t), threshold=0.75))
            for t in ("tenant-a", "tenant-b")
        }

    # About 0.9 similar: the verifier (tenant-a, balanced) serves it; the rule guard alone
    # (tenant-b) wants 0.75 + the 0.25 question margin.
    assert found["tenant-a"].kind == pb.HIT_KIND_SEMANTIC
    assert found["tenant-b"].reason == "guard_similarity"


async def test_guard_can_be_switched_off(make_settings, serve_cache, req) -> None:
    async with serve_cache(make_settings(guard=False)) as served:
        await served.stub.Store(req.store(req.key("Is it safe to eat raw eggs?")))
        found = await served.stub.Lookup(req.lookup(req.key("Is it not safe to eat raw eggs?")))
        assert found.kind == pb.HIT_KIND_SEMANTIC  # what an unguarded cache serves


async def test_semantic_matching_keys_on_the_whole_conversation(served, req) -> None:
    history_a = [
        (S, "You are a biographer."),
        (U, "Tell me about Tim Cook."),
        (A, "He runs Apple."),
    ]
    history_b = [(S, "You are a biographer."), (U, "Tell me about Satya Nadella."),
                 (A, "He runs Microsoft.")]  # fmt: skip
    await served.stub.Store(req.store(req.key("How old is he?", history=history_a), "64"))

    same = await served.stub.Lookup(req.lookup(req.key("how old is he", history=history_a)))
    other = await served.stub.Lookup(req.lookup(req.key("how old is he", history=history_b)))

    assert same.kind == pb.HIT_KIND_SEMANTIC
    assert other.kind == pb.HIT_KIND_MISS


async def test_feedback_removes_the_entry_and_blocks_the_pair(served, req) -> None:
    stored_key = req.key("How can I learn to play the guitar quickly?")
    query = req.key("What is the quickest way to learn to play the guitar?")
    other_query = req.key("How do I learn to play the guitar quickly?")
    await served.stub.Store(req.store(stored_key))
    hit = await served.stub.Lookup(req.lookup(query, threshold=0.7))
    assert hit.kind == pb.HIT_KIND_SEMANTIC

    feedback = await served.stub.Feedback(
        pb.FeedbackRequest(tenant_id="tenant-a", entry_id=hit.entry_id, key=query)
    )
    assert feedback.removed
    assert feedback.pair_blocked
    assert (await served.stub.Lookup(req.lookup(stored_key))).kind == pb.HIT_KIND_MISS

    # Stored again under the same id: the reported pair stays blocked, others still match.
    await served.stub.Store(req.store(stored_key))
    blocked = await served.stub.Lookup(req.lookup(query, threshold=0.7))
    assert blocked.kind == pb.HIT_KIND_MISS
    assert blocked.reason == "feedback_blocked"
    assert (await served.stub.Lookup(req.lookup(other_query, threshold=0.7))).kind == (
        pb.HIT_KIND_SEMANTIC
    )
    assert (await served.stub.Lookup(req.lookup(stored_key))).kind == pb.HIT_KIND_EXACT


async def test_invalidate_by_entry_model_and_tenant(served, req) -> None:
    a1 = req.key("first", ids=[1])
    a2 = req.key("second", ids=[2], model="other-model")
    a3 = req.key("third", ids=[3])
    b1 = req.key("first", ids=[1], tenant="tenant-b")
    entry = (await served.stub.Store(req.store(a1))).entry_id
    for key in (a2, a3, b1):
        await served.stub.Store(req.store(key))

    one = await served.stub.Invalidate(pb.InvalidateRequest(tenant_id="tenant-a", entry_id=entry))
    model = await served.stub.Invalidate(
        pb.InvalidateRequest(tenant_id="tenant-a", model="other-model")
    )
    assert (one.removed, model.removed) == (1, 1)
    assert (await served.stub.Lookup(req.lookup(a3))).kind == pb.HIT_KIND_EXACT

    tenant = await served.stub.Invalidate(pb.InvalidateRequest(tenant_id="tenant-a"))
    assert tenant.removed == 1
    assert (await served.stub.Lookup(req.lookup(a3))).kind == pb.HIT_KIND_MISS
    assert (await served.stub.Lookup(req.lookup(b1))).kind == pb.HIT_KIND_EXACT


async def test_stats_report_entries_bytes_and_hit_rates(served, req) -> None:
    key = req.key("What is 2 + 2?")
    await served.stub.Store(req.store(key, "4"))
    await served.stub.Lookup(req.lookup(key))
    await served.stub.Lookup(req.lookup(req.key("What is two plus two?")))
    await served.stub.Lookup(req.lookup(req.key("Unrelated question about cats")))

    stats = await served.stub.Stats(pb.StatsRequest(tenant_id="tenant-a"))
    everyone = await served.stub.Stats(pb.StatsRequest())

    assert (stats.entries, stats.lookups, stats.exact_hits, stats.stores) == (1, 3, 1, 1)
    assert stats.semantic_hits + stats.misses == 2
    assert stats.exact_hit_rate == pytest.approx(1 / 3)
    assert 0 < stats.bytes <= stats.budget_bytes
    assert stats.store_available
    assert stats.indexed_vectors == 1
    assert stats.index_ready
    assert everyone.entries >= stats.entries


InvalidCase = tuple[Callable[..., object], str]


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda r: r.lookup(r.key(tenant="")), "key.tenant_id"),
        (lambda r: r.lookup(r.key(model="")), "key.model"),
        (lambda r: r.lookup(r.key(tenant="t" * 300)), "key.tenant_id"),
        (lambda r: r.lookup(pb.CacheKey(tenant_id="t", model="m")), "key"),
        (lambda r: r.lookup(r.key(temperature=3.0)), "key.sampling.temperature"),
        (lambda r: r.lookup(r.key(top_p=0.0)), "key.sampling.top_p"),
        (lambda r: r.lookup(r.key(max_tokens=0)), "key.sampling.max_tokens"),
        (lambda r: r.lookup(r.key(stop=["x"] * 17)), "key.sampling.stop"),
        (lambda r: r.lookup(r.key(ids=[1, -2])), "key.prompt_token_ids"),
        (lambda r: r.lookup(r.key(), threshold=1.5), "options.similarity_threshold"),
        (lambda r: r.store(r.key(), ttl_seconds=-1), "ttl_seconds"),
    ],
)
async def test_bad_requests_get_invalid_argument_with_the_field(served, req, build, field) -> None:
    request = build(req)
    call = served.stub.Store if isinstance(request, pb.StoreRequest) else served.stub.Lookup

    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call(request)

    error = parse_error(caught.value)
    assert error.code == grpc.StatusCode.INVALID_ARGUMENT
    assert field in {v.field for v in error.field_violations}


async def test_bad_admin_requests_get_invalid_argument(served, req) -> None:
    cases = [
        (served.stub.Invalidate(pb.InvalidateRequest()), "tenant_id"),
        (served.stub.Invalidate(pb.InvalidateRequest(tenant_id="t", entry_id="zz")), "entry_id"),
        (
            served.stub.Invalidate(
                pb.InvalidateRequest(tenant_id="t", entry_id="0" * 32, model="m")
            ),
            "model",
        ),
        (served.stub.Feedback(pb.FeedbackRequest(tenant_id="t")), "entry_id"),
        (
            served.stub.Feedback(
                pb.FeedbackRequest(tenant_id="t", entry_id="0" * 32, key=req.key(tenant="u"))
            ),
            "key.tenant_id",
        ),
        (served.stub.Stats(pb.StatsRequest(tenant_id="x\x00")), "tenant_id"),
    ]
    for call, field in cases:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await call
        error = parse_error(caught.value)
        assert error.code == grpc.StatusCode.INVALID_ARGUMENT
        assert field in {v.field for v in error.field_violations}
    # Still healthy and serving afterwards.
    assert (await served.stub.Store(req.store(req.key("after errors")))).stored
