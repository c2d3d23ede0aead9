"""Attested tokenization: the router's own ids count once the tokenizer service vouches for
its files.

The tokenizer service's ids are the exact count (ARCHITECTURE §3); with speculation the router
starts on its own ids and still waits for the service's on every request. That wait, and the
service's CPU, buy nothing while both tokenize with the same files and code: equal
fingerprints (llm_common.tokenization.fingerprint, reported by TokenizerService.Info) mean
equal ids. So the router polls Info every `interval_s`; while the last answer is at most
`max_age_s` old and its fingerprint equals the router's, a model's prompts are counted
in-process with no call. A different fingerprint (a skewed rollout), or a service that stopped
answering, puts the model back on per-request confirmation, where a tokenizer outage is
UNAVAILABLE as before, within `max_age_s`.

A sample of attested prompts (`audit_rate`) is still sent to the service in the background;
a differing answer revokes the model's attestation until restart and is logged, so a
fingerprint that missed an input cannot go unnoticed.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from prometheus_client import Counter, Gauge

from llm_common.errors import ServiceError
from llm_common.logging import get_logger

_log = get_logger(__name__)

FetchFingerprint = Callable[[str], Awaitable[str]]


@dataclass(frozen=True, slots=True)
class AttestationSettings:
    """ROUTER_TOKENIZER_ATTEST_INTERVAL_S (0: never attested), ROUTER_TOKENIZER_AUDIT_RATE."""

    interval_s: float = 2.0
    audit_rate: float = 0.01

    @property
    def max_age_s(self) -> float:
        # Two polls may fail (a slow answer, a restart) before the router stops trusting.
        return self.interval_s * 2.5


@dataclass(frozen=True, slots=True)
class _Verdict:
    matches: bool
    at: float  # monotonic time of the service's last answer


class Attestation:
    """Per model: does the service's fingerprint, recently seen, equal the router's own?"""

    def __init__(
        self,
        local: Mapping[str, str],
        settings: AttestationSettings,
        *,
        attested_gauge: Gauge,
        audits: Counter,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        self.local = local  # model → the router's fingerprint of its own files
        self.settings = settings
        self.rng = rng or random.Random()
        self._gauge = attested_gauge
        self._audits = audits
        self._clock = clock
        self._verdicts: dict[str, _Verdict] = {}
        self._revoked: set[str] = set()

    def attested(self, model: str) -> bool:
        verdict = self._verdicts.get(model)
        return (
            verdict is not None
            and verdict.matches
            and model not in self._revoked
            and self._clock() - verdict.at <= self.settings.max_age_s
        )

    def audit(self) -> bool:
        """Whether this attested prompt is also checked against the service."""
        return self.rng.random() < self.settings.audit_rate

    def record(self, model: str, fingerprint: str) -> None:
        """The service answered Info for `model` with `fingerprint`."""
        matches = bool(fingerprint) and fingerprint == self.local.get(model)
        previous = self._verdicts.get(model)
        if previous is None or previous.matches != matches:
            _log.info("tokenizer attestation", model=model, matches=matches)
        self._verdicts[model] = _Verdict(matches, self._clock())

    def audited(self, model: str, *, equal: bool) -> None:
        """An audit's outcome: a difference revokes the model until restart."""
        self._audits.labels("equal" if equal else "different").inc()
        if equal or model in self._revoked:
            return
        self._revoked.add(model)
        self._gauge.labels(model).set(0)
        _log.error(
            "the tokenizer service's ids differ from the router's although their fingerprints"
            " are equal; this model's prompts are confirmed by the service until restart",
            model=model,
        )

    async def poll_once(self, fetch: FetchFingerprint) -> None:
        """Ask the service for every model's fingerprint once; failures leave verdicts aging."""
        for model in self.local:
            try:
                self.record(model, await fetch(model))
            except ServiceError as err:
                _log.debug("tokenizer info failed", model=model, code=err.code.name)
            self._gauge.labels(model).set(1 if self.attested(model) else 0)


class AttestationWatcher:
    """Runs Attestation.poll_once every interval, with jitter, until stopped (nothing to run
    without an attestation, models or interval)."""

    def __init__(self, attestation: Attestation | None, fetch: FetchFingerprint) -> None:
        self._attestation = attestation
        self._fetch = fetch
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        a = self._attestation
        if a is not None and a.settings.interval_s > 0 and a.local:
            self._task = asyncio.get_running_loop().create_task(self._run(a))

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self, attestation: Attestation) -> None:
        interval = attestation.settings.interval_s
        while True:
            await attestation.poll_once(self._fetch)
            # ±10%: routers started together do not poll in step.
            await asyncio.sleep(interval * attestation.rng.uniform(0.9, 1.1))
