"""Request checks: every violation is collected with its field path before any work starts."""

from __future__ import annotations

import re
from collections.abc import Sequence

from llm_cache.config import Limits, Policy
from llm_common.validation import Violations, check_range, check_repeated, check_text
from llmapi.cache.v1 import cache_service_pb2 as pb
from llmapi.common.v1 import common_pb2

ENTRY_ID = re.compile(r"[0-9a-f]{32}")
MAX_HIT_COUNT = 1_000_000
# A bad report of thousands of hits is described by its first few: the status details
# travel in a trailer, which peers limit to a few KiB.
MAX_HIT_VIOLATIONS = 16
MAX_STOP_STRINGS = 16
MAX_STOP_BYTES = 256
MAX_STOP_TOKEN_IDS = 64
_ROLES = frozenset(
    {common_pb2.ROLE_SYSTEM, common_pb2.ROLE_USER, common_pb2.ROLE_ASSISTANT, common_pb2.ROLE_TOOL}
)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def check_id(v: Violations, field: str, value: str, limits: Limits, *, required: bool) -> None:
    """A tenant or model name: printable, at most max_id_bytes."""
    if not value and not required:
        return
    if check_text(v, field, value, limits.max_id_bytes) and _CONTROL.search(value):
        v.add(field, "must not contain control characters")


def check_entry_id(v: Violations, field: str, value: str, *, required: bool) -> None:
    if not value:
        v.require(not required, field, "is required")
        return
    v.require(bool(ENTRY_ID.fullmatch(value)), field, "must be an entry id (32 hex digits)")


MAX_TOOLS = 128  # the router's limit


def check_key(v: Violations, field: str, key: pb.CacheKey, limits: Limits) -> None:
    """Tenant, model, exactly the prompt forms that are set, and the sampling parameters."""
    check_id(v, f"{field}.tenant_id", key.tenant_id, limits, required=True)
    check_id(v, f"{field}.model", key.model, limits, required=True)
    if not (key.prompt_token_ids or key.messages or key.prompt):
        v.add(field, "set prompt_token_ids, messages or prompt")
    _check_token_ids(v, f"{field}.prompt_token_ids", key.prompt_token_ids, limits.max_prompt_tokens)
    _check_messages(v, f"{field}.messages", key.messages, limits)
    check_repeated(v, f"{field}.tools", key.tools, max_items=MAX_TOOLS)
    check_text(v, f"{field}.prompt", key.prompt, limits.max_text_bytes, allow_empty=True)
    check_sampling(v, f"{field}.sampling", key.sampling)


def check_sampling(v: Violations, field: str, s: common_pb2.SamplingParams) -> None:
    if s.HasField("temperature"):
        check_range(v, f"{field}.temperature", s.temperature, min_value=0.0, max_value=2.0)
    if s.HasField("top_p"):
        ok = check_range(v, f"{field}.top_p", s.top_p, max_value=1.0)
        v.require(not ok or s.top_p > 0.0, f"{field}.top_p", "must be > 0")
    v.require(s.top_k >= 0, f"{field}.top_k", "must be >= 0")
    if s.HasField("max_tokens"):
        v.require(s.max_tokens >= 1, f"{field}.max_tokens", "must be >= 1")
    if check_repeated(v, f"{field}.stop", s.stop, max_items=MAX_STOP_STRINGS):
        for i, stop in enumerate(s.stop):
            check_text(v, f"{field}.stop[{i}]", stop, MAX_STOP_BYTES)
    _check_token_ids(v, f"{field}.stop_token_ids", s.stop_token_ids, MAX_STOP_TOKEN_IDS)


def check_options(v: Violations, field: str, options: pb.LookupOptions) -> None:
    if options.HasField("similarity_threshold"):
        value = options.similarity_threshold
        ok = check_range(v, f"{field}.similarity_threshold", value, max_value=1.0)
        v.require(not ok or value > 0.0, f"{field}.similarity_threshold", "must be in (0, 1]")


def check_response(v: Violations, field: str, r: pb.CachedResponse) -> None:
    _check_token_ids(v, f"{field}.token_ids", r.token_ids, 1 << 24)
    for name in ("prompt_tokens", "completion_tokens", "cached_tokens", "total_tokens"):
        v.require(getattr(r.usage, name) >= 0, f"{field}.usage.{name}", "must be >= 0")


def check_recorded_hits(
    v: Violations, field: str, hits: Sequence[pb.RecordedHit], limits: Limits
) -> None:
    """At most max_recorded_hits, each with a tenant, an entry id and a count in range."""
    if not check_repeated(v, field, hits, max_items=limits.max_recorded_hits):
        return
    start = len(v)
    for i, hit in enumerate(hits):
        if len(v) - start >= MAX_HIT_VIOLATIONS:
            return
        check_id(v, f"{field}[{i}].tenant_id", hit.tenant_id, limits, required=True)
        check_entry_id(v, f"{field}[{i}].entry_id", hit.entry_id, required=True)
        v.require(
            1 <= hit.count <= MAX_HIT_COUNT,
            f"{field}[{i}].count",
            f"must be in 1..{MAX_HIT_COUNT}",
        )


def check_ttl(v: Violations, field: str, ttl_s: int, policy: Policy) -> None:
    v.require(
        0 <= ttl_s <= policy.max_ttl_s, field, f"must be in 0..{policy.max_ttl_s} (0: default)"
    )


def _check_token_ids(v: Violations, field: str, ids: Sequence[int], max_items: int) -> None:
    if check_repeated(v, field, ids, max_items=max_items) and ids and min(ids) < 0:
        v.add(field, "token ids must be >= 0")


def _check_messages(
    v: Violations, field: str, messages: Sequence[common_pb2.ChatMessage], limits: Limits
) -> None:
    if not check_repeated(v, field, messages, max_items=limits.max_messages):
        return
    total = 0
    for i, m in enumerate(messages):
        v.require(m.role in _ROLES, f"{field}[{i}].role", "must be SYSTEM, USER, ASSISTANT or TOOL")
        total += len(m.content.encode("utf-8")) + len(m.name.encode("utf-8"))
    v.require(
        total <= limits.max_text_bytes,
        field,
        f"content and names must total at most {limits.max_text_bytes} bytes of UTF-8",
    )
