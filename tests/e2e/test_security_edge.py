"""Issue 32, finding 5 through the whole stack: the edge passes the client's address to auth's
HTTP ext_authz, and a stream of bad keys from one address turns into 429s that clear again."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import pytest

from .conftest import E2E_FAILED_AUTH_LIMIT, RunningStack

pytestmark = [pytest.mark.e2e, pytest.mark.security]

BAD = "sk-0123456789abcdef.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"


def get(stack: RunningStack, path: str, key: str) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(
        f"http://{stack.edge}{path}", headers={"authorization": f"Bearer {key}"}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as err:
        return err.code, {k.lower(): v for k, v in err.headers.items()}, err.read()


def test_bad_keys_from_one_address_are_throttled_then_released(stack: RunningStack) -> None:
    statuses = []
    for _ in range(E2E_FAILED_AUTH_LIMIT * 2):
        status, headers, body = get(stack, "/v1/models", BAD)
        statuses.append(status)
        if status != 401:
            break
    assert status == 429, statuses[-5:]
    assert len(statuses) > E2E_FAILED_AUTH_LIMIT // 2  # not before many failures
    error = json.loads(body)["error"]
    # OpenAI's error object, whether auth's body or the edge's own /v1 mapper answers.
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == "rate_limit_exceeded"
    wait = int(headers["retry-after"])
    assert 1 <= wait <= 60
    # The address is refused whatever it sends, until its failures drain.
    assert get(stack, "/v1/models", stack.demo_key)[0] == 429
    time.sleep(wait + 0.5)
    assert get(stack, "/v1/models", stack.demo_key)[0] == 200
