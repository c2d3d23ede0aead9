"""Exact keys, semantic namespaces and the text that gets embedded."""

from __future__ import annotations

from typing import Any

from llm_cache.canonical import request_key, tenant_tag
from llmapi.cache.v1 import cache_service_pb2 as pb
from llmapi.common.v1 import common_pb2

S, U, A = common_pb2.ROLE_SYSTEM, common_pb2.ROLE_USER, common_pb2.ROLE_ASSISTANT


def key(
    *turns: tuple[int, str], tenant: str = "t", model: str = "m", **sampling: Any
) -> pb.CacheKey:
    sampling.setdefault("temperature", 0.0)
    return pb.CacheKey(
        tenant_id=tenant,
        model=model,
        messages=[common_pb2.ChatMessage(role=r, content=c) for r, c in turns or [(U, "Hi")]],
        sampling=common_pb2.SamplingParams(**sampling),
    )


def test_the_exact_key_is_stable_and_covers_tenant_model_and_prompt() -> None:
    base = request_key(key())
    assert request_key(key()).entry_id == base.entry_id
    assert request_key(key(tenant="u")).entry_id != base.entry_id
    assert request_key(key(model="n")).entry_id != base.entry_id
    assert request_key(key((U, "Hello"))).entry_id != base.entry_id


def test_every_output_changing_parameter_is_in_the_key() -> None:
    base = request_key(key(temperature=0.5, seed=1)).entry_id
    variants = [
        {"temperature": 0.6, "seed": 1},
        {"temperature": 0.5, "seed": 2},
        {"temperature": 0.5, "seed": 1, "top_p": 0.9},
        {"temperature": 0.5, "seed": 1, "top_k": 4},
        {"temperature": 0.5, "seed": 1, "max_tokens": 10},
        {"temperature": 0.5, "seed": 1, "stop": ["x"]},
        {"temperature": 0.5, "seed": 1, "stop_token_ids": [3]},
        {"temperature": 0.5, "seed": 1, "ignore_eos": True},
    ]
    ids = {request_key(key(**v)).entry_id for v in variants}
    assert len(ids) == len(variants)
    assert base not in ids


def test_greedy_keys_ignore_sampling_knobs_and_stop_order() -> None:
    plain = request_key(key(stop=["a", "b"]))
    knobs = request_key(key(top_p=0.3, top_k=7, seed=5, stop=["b", "a", "a"]))
    assert plain.entry_id == knobs.entry_id
    assert plain.namespace == knobs.namespace


def test_determinism() -> None:
    assert request_key(key(temperature=0.0)).deterministic
    assert request_key(key(temperature=0.9, seed=3)).deterministic
    assert not request_key(key(temperature=0.9)).deterministic
    assert not request_key(pb.CacheKey(tenant_id="t", model="m", prompt="x")).deterministic
    assert not request_key(key(logprobs=True)).replayable


def test_semantic_text_is_the_last_user_message_within_its_conversation() -> None:
    first = request_key(
        key((S, "Be brief."), (U, "Who is he?"), (A, "A CEO."), (U, "  How old\n is he? "))
    )
    other = request_key(
        key((S, "Be brief."), (U, "Who is she?"), (A, "A CEO."), (U, "How old is he?"))
    )
    alone = request_key(key((U, "How old is he?")))

    assert first.semantic_text == "How old is he?"
    assert len({first.namespace, other.namespace, alone.namespace}) == 3
    assert request_key(key((U, "Hi"), (A, "Hello"))).semantic_text is None


def test_ids_only_requests_have_no_semantic_text() -> None:
    ids = request_key(pb.CacheKey(tenant_id="t", model="m", prompt_token_ids=[1, 2]))
    prompt = request_key(pb.CacheKey(tenant_id="t", model="m", prompt="Once upon"))
    assert ids.semantic_text is None
    assert prompt.semantic_text == "Once upon"
    assert ids.entry_id != prompt.entry_id


def test_unicode_is_normalised() -> None:
    composed = request_key(key((U, "caf\u00e9")))
    decomposed = request_key(key((U, "cafe\u0301")))
    assert composed.entry_id == decomposed.entry_id


def test_tenant_tags_are_short_digests() -> None:
    assert tenant_tag("acme") == tenant_tag("acme")
    assert tenant_tag("acme") != tenant_tag("acme2")
    assert len(tenant_tag("{odd} tenant*")) == 16


def test_output_shaping_options_are_in_the_key_even_when_greedy() -> None:
    base = request_key(key())
    fmt = common_pb2.OutputFormat(json_schema='{"type": "object"}')
    variants: list[dict[str, Any]] = [
        {"presence_penalty": 0.5},
        {"frequency_penalty": -0.5},
        {"repetition_penalty": 1.2},
        {"logit_bias": {5: 10.0}},
        {"logit_bias": {5: -10.0}},
        {"min_tokens": 3},
        {"min_p": 0.1},
        {"n": 2},
        {"format": fmt},
        {"format": common_pb2.OutputFormat(json_object=True)},
    ]
    ids = {request_key(key(**v)).entry_id for v in variants}
    assert len(ids) == len(variants)
    assert base.entry_id not in ids
    # Each also separates semantic matching (a JSON answer never serves a free-text one).
    assert request_key(key(format=fmt)).namespace != base.namespace
    assert not request_key(key(top_logprobs=2)).replayable


def test_tools_and_tool_turns_are_in_the_exact_and_semantic_identity() -> None:
    def with_tools(*names: str, call_args: str = "") -> pb.CacheKey:
        k = key((S, "be brief"), (U, "weather in Paris?"))
        for name in names:
            k.tools.add(type="function", function=common_pb2.FunctionDefinition(name=name))
        if call_args:
            turn = k.messages.add(role=A)
            turn.tool_calls.add(
                id="c1", function=common_pb2.FunctionCall(name="w", arguments=call_args)
            )
            k.messages.add(role=common_pb2.ROLE_TOOL, content="sunny", tool_call_id="c1")
            k.messages.add(role=U, content="and tomorrow?")
        return k

    plain, one, other = (request_key(with_tools(*n)) for n in ((), ("w",), ("x",)))
    assert len({plain.entry_id, one.entry_id, other.entry_id}) == 3
    assert len({plain.namespace, one.namespace, other.namespace}) == 3
    first = request_key(with_tools("w", call_args='{"city": "Paris"}'))
    second = request_key(with_tools("w", call_args='{"city": "Rome"}'))
    assert first.entry_id != second.entry_id
    assert first.namespace != second.namespace
