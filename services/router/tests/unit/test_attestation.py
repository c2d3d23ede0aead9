"""Attestation: a model's prompts are counted in-process only while the tokenizer service's
fingerprint, seen recently, equals the router's own; an audit that differs revokes it."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from llm_common.errors import Unavailable
from llm_router.observability import RouterMetrics
from llm_router.tokens.attestation import Attestation, AttestationSettings

MODEL = "m"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def attestation(clock: Clock, *, interval_s: float = 2.0) -> tuple[Attestation, RouterMetrics]:
    metrics = RouterMetrics(CollectorRegistry())
    made = Attestation(
        {MODEL: "ours"},
        AttestationSettings(interval_s=interval_s),
        attested_gauge=metrics.tokenizer_attested,
        audits=metrics.tokenizer_audits,
        clock=clock,
    )
    return made, metrics


def gauge(metrics: RouterMetrics) -> float:
    return metrics.tokenizer_attested.labels(MODEL)._value.get()


def test_nothing_is_attested_before_the_service_answered() -> None:
    made, _ = attestation(Clock())
    assert not made.attested(MODEL)
    assert not made.attested("unknown")


def test_equal_fingerprints_attest_until_the_answer_is_too_old() -> None:
    clock = Clock()
    made, _ = attestation(clock, interval_s=2.0)
    made.record(MODEL, "ours")
    assert made.attested(MODEL)
    clock.now += 5.0  # 2.5 intervals: two polls may fail
    assert made.attested(MODEL)
    clock.now += 0.01
    assert not made.attested(MODEL)
    made.record(MODEL, "ours")
    assert made.attested(MODEL)


@pytest.mark.parametrize("theirs", ["other", ""])
def test_a_different_or_missing_fingerprint_does_not_attest(theirs: str) -> None:
    # "" is what a tokenizer service from before fingerprints answers.
    made, _ = attestation(Clock())
    made.record(MODEL, theirs)
    assert not made.attested(MODEL)
    made.record("unknown", "ours")  # a model the router has no files for
    assert not made.attested("unknown")


def test_a_changed_fingerprint_withdraws_at_once() -> None:
    made, _ = attestation(Clock())
    made.record(MODEL, "ours")
    made.record(MODEL, "redeployed")
    assert not made.attested(MODEL)


def test_a_differing_audit_revokes_until_restart() -> None:
    made, metrics = attestation(Clock())
    made.record(MODEL, "ours")
    made.audited(MODEL, equal=True)
    assert made.attested(MODEL)
    made.audited(MODEL, equal=False)
    assert not made.attested(MODEL)
    made.record(MODEL, "ours")  # the fingerprint still claims equality: not trusted again
    assert not made.attested(MODEL)
    assert gauge(metrics) == 0
    audits = metrics.tokenizer_audits
    assert audits.labels("equal")._value.get() == 1
    assert audits.labels("different")._value.get() == 1


async def test_poll_records_answers_and_lets_failures_age() -> None:
    clock = Clock()
    made, metrics = attestation(clock)
    answers: dict[str, str | Exception] = {MODEL: "ours"}

    async def fetch(model: str) -> str:
        answer = answers[model]
        if isinstance(answer, Exception):
            raise answer
        return answer

    await made.poll_once(fetch)
    assert made.attested(MODEL)
    assert gauge(metrics) == 1
    answers[MODEL] = Unavailable("tokenizer down")
    clock.now += 3.0
    await made.poll_once(fetch)  # a failed poll changes nothing yet
    assert made.attested(MODEL)
    clock.now += 3.0
    await made.poll_once(fetch)
    assert not made.attested(MODEL)
    assert gauge(metrics) == 0


def test_audit_rate_samples() -> None:
    made, _ = attestation(Clock())
    never = Attestation(
        {},
        AttestationSettings(audit_rate=0.0),
        attested_gauge=RouterMetrics(CollectorRegistry()).tokenizer_attested,
        audits=RouterMetrics(CollectorRegistry()).tokenizer_audits,
    )
    assert not any(never.audit() for _ in range(1000))
    sampled = sum(made.audit() for _ in range(20_000))  # 1% by default
    assert 100 < sampled < 320
