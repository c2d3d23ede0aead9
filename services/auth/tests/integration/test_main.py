"""`python -m llm_auth` as processes: the keys CLI, start-up errors, serving, draining."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from llm_auth.apikeys import generate_key, parse_key
from llm_testing import free_port
from llmapi.auth.v1 import auth_service_pb2 as pb
from llmapi.auth.v1 import auth_service_pb2_grpc as pb_grpc

pytestmark = pytest.mark.integration
TIMEOUT_S = 30
PEPPER = "cli-pepper-" + "x" * 32


def env_for(redis_url: str, prefix: str, **extra: str) -> dict[str, str]:
    env = {**os.environ, "METRICS_PORT": "off", "LOG_LEVEL": "WARNING"}
    env.update(REDIS_URL=redis_url, AUTH_REDIS_PREFIX=prefix, AUTH_PEPPER=PEPPER, **extra)
    return env


def run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "llm_auth", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )


def test_keys_create_list_revoke(redis_url: str, prefix: str) -> None:
    env = env_for(redis_url, prefix)
    created = run(
        env, "keys", "create", "--tenant", "acme", "--name", "ci", "--scope", "completion:write",
        "--model", "demo-llama", "--rpm", "60", "--ttl", "30d", "--label", "team=ml",
    )  # fmt: skip
    assert created.returncode == 0, created.stderr
    key = json.loads(created.stdout)
    assert key["secret"].startswith(f"sk-{key['key_id']}.")
    assert key["limits"]["requests_per_minute"] == 60
    assert key["labels"] == {"team": "ml"}
    assert key["expires_at_ms"] > key["created_at_ms"]
    assert "cannot be shown again" in created.stderr

    listed = run(env, "keys", "list", "--tenant", "acme")
    assert listed.returncode == 0, listed.stderr
    rows = [json.loads(line) for line in listed.stdout.splitlines()]
    assert [row["key_id"] for row in rows] == [key["key_id"]]
    assert "secret" not in rows[0]
    assert key["secret"] not in listed.stdout

    revoked = run(env, "keys", "revoke", key["key_id"])
    assert revoked.returncode == 0, revoked.stderr
    assert json.loads(revoked.stdout)["revoked_at_ms"] is not None
    assert run(env, "keys", "list", "--tenant", "acme").stdout == ""
    assert run(env, "keys", "revoke", "0123456789abcdef").returncode == 1


@pytest.mark.security
def test_operator_commands_are_audited(redis_url: str, prefix: str, tmp_path: Path) -> None:
    """Issue 32: `keys create|revoke` straight against Redis leave audit events too."""
    audit = tmp_path / "audit.jsonl"
    env = env_for(redis_url, prefix, AUDIT_LOG_FILE=str(audit))
    created = run(env, "keys", "create", "--tenant", "acme", "--name", "ops")
    key = json.loads(created.stdout)
    assert run(env, "keys", "revoke", key["key_id"]).returncode == 0
    text = audit.read_text(encoding="utf-8")
    events = [json.loads(line) for line in text.splitlines()]
    assert [(e["action"], e["target"], e["outcome"]) for e in events] == [
        ("key.create", "tenant:acme", "OK"),
        ("key.revoke", f"key:{key['key_id']}", "OK"),
    ]
    assert events[0]["actor"].startswith("operator:")
    assert events[0]["details"]["key_id"] == key["key_id"]
    assert key["secret"].split(".")[1] not in text
    assert "key.create" not in created.stderr  # not in the service's own log stream


def test_cli_rejects_bad_input_and_configuration(redis_url: str, prefix: str) -> None:
    env = env_for(redis_url, prefix)
    bad = run(env, "keys", "create", "--tenant", "{bad}", "--ttl", "soon")
    assert bad.returncode == 2
    assert "ttl" in bad.stderr
    bad = run(env, "keys", "create", "--tenant", "{bad}", "--rpm", "-1")
    assert bad.returncode == 2
    assert "tenant_id" in bad.stderr
    assert "limits.requests_per_minute" in bad.stderr
    no_pepper = {k: v for k, v in env.items() if k != "AUTH_PEPPER"}
    result = run(no_pepper, "keys", "list", "--tenant", "acme")
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "llm-auth: configuration error: AUTH_PEPPER: is required (or AUTH_PEPPER_FILE)"
    )


def test_generate_prints_a_usable_bootstrap_key() -> None:
    result = run({**os.environ}, "keys", "generate")
    assert result.returncode == 0
    assert parse_key(result.stdout.strip()).key_id


def test_bad_configuration_fails_start_up_with_one_line(redis_url: str, prefix: str) -> None:
    result = run(env_for(redis_url, prefix, AUTH_RATE_LIMIT_FAILURE_MODE="sometimes"))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "llm-auth: configuration error: AUTH_RATE_LIMIT_FAILURE_MODE: "
        "must be open or closed, got 'sometimes'"
    ]


def test_serves_with_the_bootstrap_key_then_drains(redis_url: str, prefix: str) -> None:
    port = free_port()
    bootstrap = generate_key().text
    env = env_for(redis_url, prefix, GRPC_PORT=str(port), AUTH_BOOTSTRAP_ADMIN_KEY=bootstrap)
    process = subprocess.Popen([sys.executable, "-m", "llm_auth"], env=env)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            health = health_pb2_grpc.HealthStub(channel)
            # NOT_SERVING until start-up (the bootstrap key stored; on a cluster, with a
            # replica's acknowledgement) is over.
            deadline = time.monotonic() + TIMEOUT_S
            while True:
                reply = health.Check(
                    health_pb2.HealthCheckRequest(), timeout=TIMEOUT_S, wait_for_ready=True
                )
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    break
                assert time.monotonic() < deadline, "never SERVING"
                time.sleep(0.05)
            stub = pb_grpc.AuthServiceStub(channel)
            created = stub.CreateKey(
                pb.CreateKeyRequest(tenant_id="acme", scopes=["completion:write"]),
                metadata=[("x-api-key", bootstrap)],
                timeout=5,
            )
            who = stub.Authenticate(pb.AuthenticateRequest(credential=created.secret), timeout=5)
            assert who.principal.tenant_id == "acme"
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=TIMEOUT_S) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
