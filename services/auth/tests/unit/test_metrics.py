"""AuthMetrics counts per label set, also when the same labels come back (cached children)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from llm_auth.metrics import AuthMetrics


def test_counters_per_label_set() -> None:
    registry = CollectorRegistry()
    metrics = AuthMetrics(registry)
    for outcome in ("ok", "ok", "API_KEY_INVALID", "ok"):
        metrics.authenticated("api_key", outcome)
    metrics.authenticated("jwt", "ok")
    for status in (200, 401, 200):
        metrics.ext_authz_answer(status)

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, labels)

    auth = "llm_auth_authentications_total"
    assert value(auth, credential_type="api_key", outcome="ok") == 3
    assert value(auth, credential_type="api_key", outcome="API_KEY_INVALID") == 1
    assert value(auth, credential_type="jwt", outcome="ok") == 1
    assert value("llm_auth_ext_authz_checks_total", status="200") == 2
    assert value("llm_auth_ext_authz_checks_total", status="401") == 1
