"""`make images` and `make test-images`: build the images from infra/docker/Dockerfile, run
them with infra/compose.yaml and check them.

build   every target (six services + envoy) with BASE_IMAGE, BuildKit, the wheelhouse
test    build; start the compose stack (host network); wait for every HEALTHCHECK; a chat and
        an embedding through the edge; per image: size, user, read-only root filesystem, no
        compilers or pip caches; stop; then a code change in the router and its rebuild time
        (only the code layer and the final copy may run). Writes bench/results/images.json.

Environment: DOCKER (the docker CLI; BuildKit must be usable), COMPOSE (docker-compose or
"docker compose"), BASE_IMAGE (default python:3.11-slim), REDIS_IMAGE (for compose's redis).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = "infra/docker/Dockerfile"
COMPOSE_FILE = ROOT / "infra" / "compose.yaml"
WHEELHOUSE = ROOT / ".cache" / "wheelhouse"
RESULTS = ROOT / "bench" / "results" / "images.json"
SERVICES = ("auth", "tokenizer", "cache", "billing", "router", "inference")
TARGETS = (*SERVICES, "envoy")
# The file the rebuild measurement changes (and restores): the router's own code.
PROBE = ROOT / "services" / "router" / "src" / "llm_router" / "__init__.py"
HEALTH_TIMEOUT_S = 600.0
# With the vfs storage driver creating a container copies its whole image (inference: GBs):
# far longer than compose's 60 s API timeout.
COMPOSE_ENV = {"COMPOSE_HTTP_TIMEOUT": "1800", "DOCKER_CLIENT_TIMEOUT": "1800"}
COMPILERS = ("gcc", "cc", "c++", "g++", "clang", "make")


@dataclass
class Built:
    """One image: its build time, size and what it runs as."""

    name: str
    build_s: float
    size_mb: float = 0.0
    user: str = ""
    healthy: bool = False
    read_only_rootfs: bool = False
    compilers: list[str] = field(default_factory=list)
    pip_cache: bool = False
    cached_steps: int = 0


def _docker() -> list[str]:
    return shlex.split(os.environ.get("DOCKER", "docker"))


def _compose() -> list[str]:
    return [*shlex.split(os.environ.get("COMPOSE", "docker-compose")), "-f", str(COMPOSE_FILE)]


def _run(args: Sequence[str], *, env: dict[str, str] | None = None, timeout: float = 3600) -> str:
    done = subprocess.run(
        list(args),
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if done.returncode != 0:
        tail = (done.stdout + done.stderr)[-4000:]
        raise RuntimeError(f"{' '.join(args[:4])}... failed ({done.returncode}):\n{tail}")
    return done.stdout + done.stderr


def build(target: str, base_image: str) -> Built:
    """One target, tagged llm-<target>; BuildKit's log tells how many steps were cached."""
    if not WHEELHOUSE.is_dir():
        raise RuntimeError(f"no wheelhouse in {WHEELHOUSE}: run `make wheelhouse` first")
    started = time.monotonic()
    args = [*_docker(), "build", "--progress=plain", "-f", DOCKERFILE, "--target", target]
    args += ["--build-arg", f"BASE_IMAGE={base_image}", "-t", f"llm-{target}", "."]
    log = _run(args, env={"DOCKER_BUILDKIT": "1"})
    built = Built(target, round(time.monotonic() - started, 1))
    built.cached_steps = sum(1 for line in log.splitlines() if line.endswith(" CACHED"))
    built.size_mb = round(int(_inspect(f"llm-{target}", "{{.Size}}")) / 1e6, 1)
    built.user = _inspect(f"llm-{target}", "{{.Config.User}}")
    return built


def _inspect(ref: str, template: str) -> str:
    return _run([*_docker(), "inspect", "-f", template, ref]).strip()


def build_all(base_image: str) -> list[Built]:
    found = []
    for target in TARGETS:
        built = build(target, base_image)
        print(f"llm-{target}: {built.size_mb} MB, built in {built.build_s} s", flush=True)
        found.append(built)
    return found


def inspect_contents(built: Built) -> None:
    """Compilers on PATH and pip caches in the image (none expected)."""
    probe = "for c in " + " ".join(COMPILERS) + "; do command -v $c; done; "
    probe += "ls -d /root/.cache/pip /home/*/.cache/pip 2>/dev/null; true"
    args = [*_docker(), "run", "--rm", "--network", "none", "--entrypoint", "/bin/sh"]
    out = _run([*args, f"llm-{built.name}", "-c", probe])
    lines = [line.strip() for line in out.splitlines() if line.strip()]
    built.compilers = [line for line in lines if "/.cache/pip" not in line]
    built.pip_cache = any("/.cache/pip" in line for line in lines)


def _containers() -> dict[str, str]:
    """Compose service -> container id."""
    out = _run([*_compose(), "ps", "-q"], env=COMPOSE_ENV)
    found = {}
    for cid in out.split():
        service = _inspect(cid, '{{index .Config.Labels "com.docker.compose.service"}}')
        found[service] = cid
    return found


def wait_healthy(timeout_s: float = HEALTH_TIMEOUT_S) -> dict[str, str]:
    """Every container's HEALTHCHECK status once all are healthy (or at the deadline)."""
    deadline = time.monotonic() + timeout_s
    states: dict[str, str] = {}
    while time.monotonic() < deadline:
        states = {s: _inspect(c, "{{.State.Health.Status}}") for s, c in _containers().items()}
        if states and all(v == "healthy" for v in states.values()):
            return states
        if any(v == "unhealthy" for v in states.values()):
            break
        time.sleep(3)
    return states


def through_the_edge(edge: str, admin_key: str) -> dict[str, object]:
    """A chat and an embedding through Envoy with a fresh key."""
    import grpc

    from llm_stack.demo import create_key
    from llmapi.common.v1 import common_pb2
    from llmapi.llm.v1 import llm_service_pb2 as pb
    from llmapi.llm.v1 import llm_service_pb2_grpc as pb_grpc

    key = create_key(edge, admin_key, tenant="images", name="test-images")
    metadata = (("authorization", f"Bearer {key}"),)
    with grpc.insecure_channel(edge) as channel:
        stub = pb_grpc.LLMServiceStub(channel)
        chat = stub.Chat(
            pb.ChatRequest(
                model="demo-llama",
                messages=[common_pb2.ChatMessage(role=common_pb2.ROLE_USER, content="Say hello.")],
                sampling=common_pb2.SamplingParams(max_tokens=8, temperature=0),
            ),
            metadata=metadata,
            timeout=120,
        )
        embed = stub.Embed(
            pb.EmbedRequest(model="all-minilm-l6-v2", inputs=["hello", "world"]),
            metadata=metadata,
            timeout=120,
        )
    return {
        "chat_tokens": chat.usage.completion_tokens,
        "embedding_dims": [len(e.values) for e in embed.embeddings],
    }


def _rebuild_after_code_change(base_image: str) -> Built:
    original = PROBE.read_text(encoding="utf-8")
    PROBE.write_text(original + f"# rebuild probe {time.time()}\n", encoding="utf-8")
    try:
        return build("router", base_image)
    finally:
        PROBE.write_text(original, encoding="utf-8")


def test(base_image: str) -> dict[str, object]:
    images = build_all(base_image)
    for built in images:
        inspect_contents(built)
    _run([sys.executable, "-m", "llm_stack", "prepare"])
    _open_run_dir()
    result: dict[str, object] = {"base_image": base_image}
    try:
        _run([*_compose(), "up", "-d", "--no-build"], env=COMPOSE_ENV, timeout=3600)
        states = wait_healthy()
        result["health"] = states
        for built in images:
            built.healthy = all(
                v == "healthy" for s, v in states.items() if _image_of(s) == built.name
            )
        for service, cid in _containers().items():
            ro = _inspect(cid, "{{.HostConfig.ReadonlyRootfs}}") == "true"
            for built in images:
                if _image_of(service) == built.name:
                    built.read_only_rootfs = ro
        admin_key = (ROOT / ".run" / "secrets" / "admin-api-key").read_text().strip()
        result["through_edge"] = through_the_edge("127.0.0.1:8080", admin_key)
        result["chat_through_compose"] = True
    except Exception as exc:  # recorded, then the stack is stopped
        result["chat_through_compose"] = False
        result["error"] = str(exc)[-2000:]
    finally:
        result["compose_logs_tail"] = _logs_tail()
        try:
            _run([*_compose(), "down", "-v", "--remove-orphans"], env=COMPOSE_ENV, timeout=1800)
        except RuntimeError as exc:
            result["down_error"] = str(exc)[-500:]
    rebuilt = _rebuild_after_code_change(base_image)
    result["images"] = [asdict(b) for b in images]
    result["rebuild_after_code_change_s"] = rebuilt.build_s
    result["rebuild_cached_steps"] = rebuilt.cached_steps
    return result


def _image_of(service: str) -> str:
    return "inference" if service.startswith("inference") else service


def _open_run_dir() -> None:
    """The containers run as uid 1000 (services) and 101 (Envoy): the secrets must be
    readable and Envoy's log directory writable by them."""
    run = ROOT / ".run"
    (run / "secrets").chmod(0o755)
    for path in (run / "secrets").iterdir():
        path.chmod(0o644)
    # Sticky: Envoy (uid 101) writes its logs and its admin socket here; nobody else may
    # remove or replace what it made.
    (run / "envoy" / "logs").chmod(0o1777)


def _logs_tail() -> str:
    try:
        logs = _run([*_compose(), "logs", "--tail", "5", "--no-color"], env=COMPOSE_ENV)
        return logs[-3000:]
    except RuntimeError as exc:
        return str(exc)[-500:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("command", choices=("build", "test"))
    parser.add_argument("--base-image", default=os.environ.get("BASE_IMAGE", "python:3.11-slim"))
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.command == "build":
        build_all(args.base_image)
        return
    result = test(args.base_image)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    summary = {k: result.get(k) for k in ("chat_through_compose", "rebuild_after_code_change_s")}
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
