"""Parsing and validating Envoy rate-limit requests."""

from __future__ import annotations

import pytest
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.service.ratelimit.v3 import rls_pb2

from llm_auth.descriptors import Override, parse_request
from llm_common.errors import InvalidArgument


def descriptor(*entries: tuple[str, str], **fields: object) -> ratelimit_pb2.RateLimitDescriptor:
    d = ratelimit_pb2.RateLimitDescriptor(**fields)
    for key, value in entries:
        d.entries.add(key=key, value=value)
    return d


def test_hits_default_to_the_request_addend_or_one() -> None:
    request = rls_pb2.RateLimitRequest(
        domain="llm", descriptors=[descriptor(("tenant", "a")), descriptor(("tenant", "b"))]
    )
    _, parsed = parse_request(request)
    assert [d.hits for d in parsed] == [1, 1]
    request.hits_addend = 5
    _, parsed = parse_request(request)
    assert [d.hits for d in parsed] == [5, 5]


def test_descriptor_addend_zero_means_check_only() -> None:
    d = descriptor(("tenant", "a"))
    d.hits_addend.value = 0
    _, parsed = parse_request(rls_pb2.RateLimitRequest(domain="llm", descriptors=[d]))
    assert parsed[0].hits == 0
    assert parsed[0].get("tenant") == "a"
    assert parsed[0].get("key_id") is None


def test_override_becomes_a_limit_and_period() -> None:
    d = descriptor(("generic_key", "x"))
    d.limit.requests_per_unit = 7
    d.limit.unit = 3  # HOUR
    _, parsed = parse_request(rls_pb2.RateLimitRequest(domain="llm", descriptors=[d]))
    assert parsed[0].override == Override(limit=7, period_s=3600.0)
    assert parsed[0].fingerprint("llm") != parsed[0].fingerprint("other")


def test_every_violation_is_reported() -> None:
    bad = descriptor(("", "x" * 300))
    bad.limit.requests_per_unit = 0
    request = rls_pb2.RateLimitRequest(domain="", descriptors=[bad, descriptor()])
    with pytest.raises(InvalidArgument) as caught:
        parse_request(request)
    fields = {v.field for v in caught.value.violations}
    assert fields == {
        "domain",
        "descriptors[0].entries[0].key",
        "descriptors[0].entries[0].value",
        "descriptors[0].limit.requests_per_unit",
        "descriptors[0].limit.unit",
        "descriptors[1].entries",
    }


def test_no_descriptors_is_invalid() -> None:
    with pytest.raises(InvalidArgument) as caught:
        parse_request(rls_pb2.RateLimitRequest(domain="llm"))
    assert [v.field for v in caught.value.violations] == ["descriptors"]
