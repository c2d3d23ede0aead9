"""Issue 32, finding 4, on a real Envoy: a credential in the query string (any case, any of
the usual names) is never written to a log, whatever became of the request (refused by auth,
served, transcoded, too large, unknown on the mesh). Envoy's access logs drop the query
string; the edge's Lua scrub removes credential-like parameters before auth's HTTP check
or the router see the path (auth logs no paths either)."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from llm_envoy.policy_model import Limits
from llm_envoy.testing import post_body, wait_for
from llm_envoy.topology import LLM_SERVICE
from llm_testing.logs import captured_logs

from .edge_auth import Edge, edge_with_auth

pytestmark = [
    pytest.mark.integration,
    pytest.mark.security,
    pytest.mark.asyncio(loop_scope="module"),
]

SECRET = "sk-0123456789abcdef.QUERYSECRETQUERYSECRETQUERYSECRETQUERYSECR"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def edge(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Edge]:
    async with edge_with_auth(redis_url, tmp_path_factory.mktemp("edge")) as running:
        yield running


def _request(
    address: str, method: str, path: str, headers: dict[str, str], body: bytes | None = None
) -> int:
    request = urllib.request.Request(
        f"http://{address}{path}", data=body, headers=headers, method=method
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            status: int = reply.status
            return status
    except urllib.error.HTTPError as err:
        return err.code


async def test_query_string_credentials_never_reach_a_log(edge: Edge) -> None:
    auth = {"authorization": f"Bearer {edge.key}", "content-type": "application/json"}
    address = edge.envoy.edge_http
    with captured_logs() as auth_logs:
        statuses = await asyncio.gather(
            asyncio.to_thread(_request, address, "GET", f"/v1/models?api_key={SECRET}", {}),
            asyncio.to_thread(
                _request, address, "POST", f"/v1/chat/completions?x=1&Token={SECRET}", auth, b"{}"
            ),
            asyncio.to_thread(
                _request,
                address,
                "POST",
                f"/{LLM_SERVICE}/ListModels?ACCESS_TOKEN={SECRET}",
                auth,
                b"{}",
            ),
            asyncio.to_thread(
                post_body,
                address,
                f"/v1/embeddings?password={SECRET}&key={SECRET}",
                auth,
                (Limits().max_request_body_bytes or 0) + 1,
            ),
            asyncio.to_thread(_request, edge.envoy.mesh, "GET", f"/nowhere?signature={SECRET}", {}),
        )
    codes = [s if isinstance(s, int) else s.status for s in statuses]
    assert codes == [401, 200, 200, 413, 404]
    paths = ["/v1/models", "/v1/chat/completions", f"/{LLM_SERVICE}/ListModels", "/v1/embeddings"]
    paths.append("/nowhere")

    def all_logged() -> bool:
        logged = {json.loads(line).get("path") for line in _json_lines(edge.envoy.log_text())}
        return all(p in logged for p in paths)

    assert await asyncio.to_thread(wait_for, all_logged), edge.envoy.log_text()[-2000:]
    assert "QUERYSECRET" not in edge.envoy.log_text()
    assert "QUERYSECRET" not in auth_logs.text
    # The edge removed the credential before the router saw the path; the rest stays.
    assert "/v1/chat/completions?x=1" in edge.envoy.recorder.http_requests
    assert not any("QUERYSECRET" in path for path in edge.envoy.recorder.http_requests)


def _json_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("{")]
