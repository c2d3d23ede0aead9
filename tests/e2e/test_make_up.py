"""`make up` / `make status` / `make down` as a developer runs them (on free ports), with the
printed demo key used by `llmctl`."""

from __future__ import annotations

import os
import queue
import re
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import REPO, _delete_prefix

pytestmark = pytest.mark.e2e

UP_TIMEOUT_S = 240.0


def _lines(stream: object, sink: queue.Queue[str]) -> None:
    for line in stream:  # type: ignore[attr-defined]
        sink.put(line)


@pytest.fixture
def made_up(
    tmp_path: Path, redis_url: str
) -> Iterator[tuple[dict[str, str], subprocess.Popen[str]]]:
    prefix = f"e2eup{uuid.uuid4().hex[:8]}:"
    env = {
        **os.environ,
        "LLM_RUN_DIR": str(tmp_path / "run"),
        "LLM_PORTS": "free",
        "REDIS_URL": redis_url,
        "LLM_REDIS_PREFIX": prefix,
    }
    up = subprocess.Popen(
        [sys.executable, "-m", "llm_stack", "up"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=_lines, args=(up.stdout, lines), daemon=True).start()
    seen: list[str] = []
    deadline = time.monotonic() + UP_TIMEOUT_S
    try:
        while not any("export LLM_API_ADDR=" in line for line in seen):
            assert up.poll() is None, "make up exited:\n" + "".join(seen)
            assert time.monotonic() < deadline, "make up did not finish:\n" + "".join(seen)
            try:
                seen.append(lines.get(timeout=1))
            except queue.Empty:
                continue
        export = next(line for line in seen if "export LLM_API_ADDR=" in line)
        match = re.search(r"LLM_API_ADDR=(\S+) LLM_API_KEY=(\S+)", export)
        assert match is not None
        env |= {"LLM_API_ADDR": match.group(1), "LLM_API_KEY": match.group(2)}
        yield env, up
    finally:
        if up.poll() is None:
            subprocess.run(
                [sys.executable, "-m", "llm_stack", "down"],
                cwd=REPO,
                env=env,
                timeout=120,
                check=False,
            )
            up.wait(timeout=60)
        _delete_prefix(redis_url, prefix)


def run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_up_status_llmctl_down(made_up: tuple[dict[str, str], subprocess.Popen[str]]) -> None:
    env, up = made_up
    status = run(["llm_stack", "status"], env)
    assert status.returncode == 0, status.stdout + status.stderr
    for name in (
        "auth",
        "tokenizer",
        "cache",
        "billing",
        "router",
        "envoy",
        "replica-50054",
        "replica-50064",
    ):
        assert re.search(rf"^\s+{name}\S*\s+pid \d+\s+healthy", status.stdout, re.M), status.stdout

    chat = run(["llmctl", "chat", "Hello", "--max-tokens", "5", "--temperature", "0"], env)
    assert chat.returncode == 0, chat.stderr
    assert chat.stdout.strip()
    assert re.search(r"\[usage: prompt=\d+ completion=[1-5] .*trace=[0-9a-f]{32}\]", chat.stderr)

    refused = run(["llmctl", "chat", "Hello"], {**env, "LLM_API_KEY": "sk-wrong"})
    assert refused.returncode == 1
    assert refused.stderr.startswith("llmctl: UNAUTHENTICATED:")
    assert refused.stderr.count("\n") == 1
    assert "Traceback" not in refused.stderr

    down = run(["llm_stack", "down"], env)
    assert down.returncode == 0, down.stdout + down.stderr
    assert up.wait(timeout=60) == 0
    after = run(["llm_stack", "status"], env)
    assert after.returncode == 1
    assert "not running" in after.stdout
