"""Audit events: their own stream (a file, apart from the service log), ids only, no secrets."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from llm_common.audit import AUDIT_LOGGER, AuditEvent, AuditLog, caller_of, configure_audit

pytestmark = pytest.mark.security


@pytest.fixture
def audit_logger() -> Iterator[logging.Logger]:
    logger = logging.getLogger(AUDIT_LOGGER)
    saved = (list(logger.handlers), logger.propagate, logger.level)
    yield logger
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
        handler.close()
    for handler in saved[0]:
        logger.addHandler(handler)
    logger.propagate, logger.level = saved[1], saved[2]


def test_events_go_to_the_audit_file_only(
    audit_logger: logging.Logger, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "audit.jsonl"
    configure_audit({"AUDIT_LOG_FILE": str(path)})
    event = AuditEvent(
        action="key.create",
        actor="0123456789abcdef",
        actor_tenant="system",
        target="tenant:acme",
        outcome="OK",
        source="ipv4:10.0.0.7:5123",
        details={
            "key_id": "fedcba9876543210",
            "secret": "sk-fedcba9876543210.AAAA",  # a sensitive key: dropped
            "note": "Bearer sk-0123456789abcdef.BBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBB",
        },
    )
    with caplog.at_level(logging.INFO):
        AuditLog().record(event)
    for handler in audit_logger.handlers:
        handler.flush()
    line = path.read_text(encoding="utf-8").strip()
    record = json.loads(line)
    assert record["log_type"] == "audit"
    assert (record["action"], record["actor"], record["target"], record["outcome"]) == (
        "key.create",
        "0123456789abcdef",
        "tenant:acme",
        "OK",
    )
    assert record["source"] == "ipv4:10.0.0.7:5123"
    assert record["at"].endswith("+00:00")
    assert record["details"]["key_id"] == "fedcba9876543210"
    assert "secret" not in record["details"]
    assert "BBBB" not in line
    assert "AAAA" not in line
    assert caplog.records == []  # nothing reached the root logger (the service's log)


def test_caller_comes_from_the_mesh_identity_metadata() -> None:
    metadata = [("x-key-id", "k1"), ("x-tenant-id", "acme"), ("x-forwarded-for", "1.2.3.4")]
    caller = caller_of(metadata, "ipv4:10.0.0.2:4000")
    assert (caller.key_id, caller.tenant, caller.source) == ("k1", "acme", "ipv4:10.0.0.2:4000")
    assert caller.source_details() == {"forwarded_for": "1.2.3.4"}
    assert caller_of(None, "peer").key_id == "-"
