"""llmctl against the running stack: generation, models, keys and usage; errors as one line."""

from __future__ import annotations

import io
import re

import pytest

from .conftest import RunningStack

pytestmark = pytest.mark.e2e


def llmctl(
    stack: RunningStack, *args: str, key: str | None = None, admin: bool = False
) -> tuple[int, str, str]:
    from llmctl.cli import main

    env = {"LLM_API_ADDR": stack.edge, "LLM_API_KEY": key or stack.demo_key}
    if admin:
        env["LLM_ADMIN_KEY"] = stack.admin_key
    out, err = io.StringIO(), io.StringIO()
    code = main(list(args), env, stdin=io.StringIO(""), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def test_complete_without_streaming_and_models(stack: RunningStack) -> None:
    code, out, err = llmctl(
        stack, "complete", "Once upon a time", "--no-stream", "--max-tokens", "4"
    )
    assert code == 0, err
    assert re.search(r"completion=[1-4] .*finish=(stop|length)", err)
    code, out, _ = llmctl(stack, "models")
    assert code == 0
    assert re.search(r"^demo-llama\s+generation\s+2048\s+small\s+demo,default$", out, re.M)


def test_embed(stack: RunningStack) -> None:
    from .test_stack_openai import embedding_model

    model = embedding_model()
    if model is None:
        pytest.skip("the catalogue lists no embedding model")
    code, out, err = llmctl(stack, "embed", "hello", "world", "--model", model)
    assert code == 0, err
    assert re.search(r"^0: dim=\d+ \[", out, re.M)
    assert re.search(r"^1: dim=\d+ \[", out, re.M)


def test_keys_lifecycle_and_usage(stack: RunningStack) -> None:
    code, out, err = llmctl(
        stack, "keys", "create", "--tenant", "e2e-cli", "--name", "cli", "--rpm", "10", admin=True
    )
    assert code == 0, err
    key_id = re.search(r"key id\s+([0-9a-f]{16})", out)
    secret = re.search(r"secret\s+(sk-\S+)", out)
    assert key_id is not None
    assert secret is not None
    code, _, err = llmctl(stack, "chat", "hi", "--max-tokens", "2", key=secret.group(1))
    assert code == 0, err
    code, out, _ = llmctl(stack, "keys", "list", "--tenant", "e2e-cli", admin=True)
    assert key_id.group(1) in out
    code, out, _ = llmctl(stack, "keys", "revoke", key_id.group(1), admin=True)
    assert code == 0
    assert out.startswith(f"revoked {key_id.group(1)}")
    code, _, err = llmctl(stack, "chat", "hi", key=secret.group(1))
    assert code == 1
    assert err.startswith("llmctl: UNAUTHENTICATED")
    code, out, err = llmctl(
        stack, "usage", "--tenant", "e2e-cli", "--granularity", "total", admin=True
    )
    assert code == 0, err
    assert re.search(r"^total\s+\d+\s+\d+\s+\d+\s+\d+\s+[0-9.]+ USD$", out, re.M)


@pytest.mark.parametrize(
    ("args", "pattern"),
    [
        (("chat", "hi", "--model", "no-such-model"), r"^llmctl: NOT_FOUND: .*no-such-model"),
        (
            ("chat", "hi", "--temperature", "9"),
            r"^llmctl: INVALID_ARGUMENT: .*sampling\.temperature",
        ),
        (("usage", "--tenant", "demo"), r"^llmctl: PERMISSION_DENIED"),
    ],
)
def test_errors_are_one_line(stack: RunningStack, args: tuple[str, ...], pattern: str) -> None:
    code, _, err = llmctl(stack, *args)
    assert code == 1
    assert re.match(pattern, err), err
    assert err.count("\n") == 1
