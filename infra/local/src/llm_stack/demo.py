"""A fresh demo API key (AuthService.CreateKey through the edge) and the start-up banner."""

from __future__ import annotations

import grpc

from llm_stack.stack import Endpoints, Stack
from llmapi.auth.v1 import auth_service_pb2 as auth_pb
from llmapi.auth.v1 import auth_service_pb2_grpc as auth_grpc

DEMO_TENANT = "demo"
DEMO_SCOPES = ("completion:write", "embedding:read")
DEMO_RPM = 600


def create_key(
    edge: str,
    admin_key: str,
    *,
    tenant: str = DEMO_TENANT,
    name: str = "make up demo",
    scopes: tuple[str, ...] = DEMO_SCOPES,
    requests_per_minute: int = DEMO_RPM,
    tokens_per_minute: int = 0,
    timeout_s: float = 10.0,
) -> str:
    """A new key's secret, created with the admin key (the edge passes key administration
    to auth, which checks the admin credential itself)."""
    request = auth_pb.CreateKeyRequest(
        tenant_id=tenant,
        name=name,
        scopes=list(scopes),
        limits=auth_pb.KeyLimits(
            requests_per_minute=requests_per_minute, tokens_per_minute=tokens_per_minute
        ),
    )
    with grpc.insecure_channel(edge) as channel:
        stub = auth_grpc.AuthServiceStub(channel)
        reply = stub.CreateKey(request, metadata=(("x-api-key", admin_key),), timeout=timeout_s)
    secret: str = reply.secret
    return secret


def start_with_key(stack: Stack, *, tenant: str, name: str) -> tuple[Endpoints, str]:
    """Start `stack` and create a key for `tenant` without a request-rate limit (benchmarks)."""
    endpoints = stack.start()
    assert stack.credentials is not None  # set once the stack has started
    key = create_key(
        endpoints.edge_http,
        stack.credentials.admin_key,
        tenant=tenant,
        requests_per_minute=0,
        name=name,
    )
    return endpoints, key


def banner(endpoints: Endpoints, demo_key: str, admin_key_file: str, run_dir: str) -> str:
    """What `make up` prints once everything is healthy."""
    e = endpoints
    return f"""
LLM platform is up.

  gRPC + REST    http://{e.edge_http}   (h2c and HTTP/1.1; LLMService, OpenAI under /v1/)
  TLS            https://{e.edge_tls}  (dev CA: {e.ca_cert})
  Envoy admin    http://{e.admin}   (reads only; the rest: {run_dir}/envoy/logs/admin.sock)
  metrics        {", ".join(f"{n}={a}" for n, a in sorted(e.metrics.items()))}
  logs           {run_dir}/logs/     admin key: {admin_key_file}

Demo API key (tenant {DEMO_TENANT}, shown once):
  export LLM_API_ADDR={e.edge_http} LLM_API_KEY={demo_key}

Try:
  .venv/bin/llmctl chat "Tell me a story"
  curl -s {e.openai_base_url}/chat/completions -H "authorization: Bearer $LLM_API_KEY" \\
       -H 'content-type: application/json' \\
       -d '{{"model": "demo", "messages": [{{"role": "user", "content": "Hi"}}]}}'

Ctrl-C or `make down` stops everything; `make status` shows what runs.
"""
