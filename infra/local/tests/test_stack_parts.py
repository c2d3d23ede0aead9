"""The supervisor's parts on their own: catalogue copy, ports, secrets, processes, state."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from llm_cache.envelope import read_key_file
from llm_common.config import ConfigError
from llm_common.grpc_runtime import GRPC_RUNTIME_ENV
from llm_stack import catalogue
from llm_stack.config import StackConfig, free_ports, metrics_port_for, parse_endpoint
from llm_stack.credentials import ensure_credentials, new_api_key
from llm_stack.process import ManagedProcess, ProcessSpec, pid_alive, terminate_recorded
from llm_stack.redis_server import redis_spec
from llm_stack.specs import base_env
from llm_stack.state import ProcessRecord, StackState, clear_state, read_state, write_state

REPO = Path(__file__).resolve().parents[3]
CATALOGUE = """
models:
  - name: gen
    checkpoint: gen
    deployments:
      - name: a
        replicas: ["127.0.0.1:50054", "localhost:50064", "10.0.0.7:50054"]
  - name: enc
    kind: embedding
    checkpoint: enc
    deployments:
      - name: b
        replicas: ["127.0.0.1:50074"]
"""


@pytest.fixture
def models(tmp_path: Path) -> Path:
    path = tmp_path / "models.yaml"
    path.write_text(CATALOGUE)
    return path


def test_local_replicas_are_this_host_s_in_catalogue_order(models: Path) -> None:
    replicas = catalogue.local_replicas(models)
    assert [(r.model, r.kind, r.port) for r in replicas] == [
        ("gen", "generation", 50054),
        ("gen", "generation", 50064),
        ("enc", "embedding", 50074),
    ]
    assert catalogue.generation_ports(replicas) == (50054, 50064)
    assert replicas[0].name == "replica-50054"


def test_the_copy_moves_local_replicas_only(models: Path, tmp_path: Path) -> None:
    copy = catalogue.write_copy(
        models, tmp_path / "run" / "models.yaml", {50054: 41000, 50074: 41001}
    )
    moved = yaml.safe_load(copy.read_text())["models"]
    assert moved[0]["deployments"][0]["replicas"] == [
        "127.0.0.1:41000",
        "127.0.0.1:50064",
        "10.0.0.7:50054",
    ]
    assert moved[1]["deployments"][0]["replicas"] == ["127.0.0.1:41001"]


def test_two_replicas_on_one_port_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "m.yaml"
    path.write_text(CATALOGUE.replace("50074", "50054"))
    with pytest.raises(ConfigError, match="one local port"):
        catalogue.local_replicas(path)


def test_free_ports_are_distinct_and_cover_every_process() -> None:
    ports = free_ports((50054, 50064))
    envoy = ports.envoy
    bound = [
        envoy.edge_http,
        envoy.edge_tls,
        envoy.admin,
        envoy.mesh,
        envoy.router_http,
        ports.redis,
    ]
    # auth's listeners for Envoy's per-request calls
    assert envoy.auth_edge is not None
    assert envoy.auth_http is not None
    bound += [envoy.auth_edge, envoy.auth_http]
    bound += (
        list(envoy.grpc.values()) + list(ports.metrics.values()) + list(ports.replicas.values())
    )
    assert len(set(bound)) == len(bound) - 1  # grpc["inference"] is the first replica's port
    assert envoy.inference == tuple(ports.replicas.values())
    assert set(ports.metrics) == {
        "auth",
        "tokenizer",
        "cache",
        "billing",
        "router",
        "replica-50054",
        "replica-50064",
    }


def test_metrics_ports_follow_the_architecture_rule() -> None:
    assert [metrics_port_for(p) for p in (50051, 50053, 50064, 50074)] == [9151, 9153, 9164, 9174]


def test_settings_from_the_environment(tmp_path: Path) -> None:
    config = StackConfig.from_env(
        tmp_path,
        {
            "LLM_RUN_DIR": "runs/a",
            "REDIS_URL": "redis://h:1/2",
            "LLM_OTLP_ENDPOINT": "http://c:4317",
            "LLM_REDIS_PREFIX": "p:",
        },
    )
    assert config.run_dir == tmp_path / "runs" / "a"
    assert (config.redis_url, config.redis_prefix) == ("redis://h:1/2", "p:")
    assert config.otlp is not None
    assert (config.otlp.host, config.otlp.port) == ("c", 4317)
    assert config.ports.envoy.edge_http == 8080
    free = StackConfig.from_env(REPO, {"LLM_PORTS": "free"})
    assert free.ports.envoy.edge_http != 8080
    with pytest.raises(ConfigError, match="LLM_PORTS"):
        StackConfig.from_env(REPO, {"LLM_PORTS": "some"})
    with pytest.raises(ConfigError, match="LLM_OTLP_ENDPOINT"):
        parse_endpoint("nohost", "LLM_OTLP_ENDPOINT")


def test_secrets_are_private_and_stable(tmp_path: Path) -> None:
    first = ensure_credentials(tmp_path / "secrets")
    assert stat.S_IMODE(first.pepper_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(first.admin_key_file.stat().st_mode) == 0o600
    assert len(first.pepper_file.read_text().strip()) >= 32
    assert stat.S_IMODE(first.cache_master_key_file.stat().st_mode) == 0o600
    master = first.cache_master_key_file.read_text()
    again = ensure_credentials(tmp_path / "secrets")
    assert again.admin_key == first.admin_key  # keys in Redis stay valid across restarts
    assert again.cache_master_key_file.read_text() == master  # so do cached entries
    assert read_key_file(again.cache_master_key_file).key_ids() == ("k1",)


def test_api_keys_have_auth_s_format() -> None:
    import re

    assert re.fullmatch(r"sk-[0-9a-f]{16}\.[A-Za-z0-9_-]{43}", new_api_key())


def test_redis_keeps_an_append_only_file_fsynced_every_second(tmp_path: Path) -> None:
    spec = redis_spec(tmp_path, 6390, {})
    args = list(spec.argv)
    assert args[args.index("--appendonly") + 1] == "yes"
    assert args[args.index("--appendfsync") + 1] == "everysec"
    assert args[args.index("--bind") + 1] == "127.0.0.1"
    assert spec.meta["url"] == "redis://127.0.0.1:6390/0"


def sleeper(tmp_path: Path, grace_s: float = 5.0) -> ProcessSpec:
    code = (
        "import signal, sys, time;"
        "signal.signal(signal.SIGTERM, lambda *a: sys.exit(3)); time.sleep(60)"
    )
    return ProcessSpec(
        "sleeper",
        [sys.executable, "-c", code],
        dict(os.environ),
        tmp_path,
        tmp_path / "s.log",
        grace_s=grace_s,
    )


def test_a_process_is_stopped_with_sigterm_and_logs_to_its_file(tmp_path: Path) -> None:
    process = ManagedProcess(sleeper(tmp_path))
    process.start()
    time.sleep(0.3)  # let the child install its handler
    assert process.alive()
    process.stop()
    assert process.exit_code() == 3
    assert "--- start" in process.log_tail()


def _proc_state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]


def _until_state(pid: int, wanted: str) -> str:
    deadline = time.monotonic() + 5
    while (state := _proc_state(pid)) != wanted and time.monotonic() < deadline:
        time.sleep(0.02)  # the kernel applies the signal asynchronously
    return state


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs procfs")
def test_a_frozen_process_is_thawed_and_still_stopped_gracefully(tmp_path: Path) -> None:
    process = ManagedProcess(sleeper(tmp_path))
    process.start()
    time.sleep(0.3)  # let the child install its handler
    assert process.pid is not None
    process.freeze()
    assert _until_state(process.pid, "T") == "T"  # stopped, not running
    process.thaw()
    assert _until_state(process.pid, "S") in ("S", "R")
    process.freeze()
    process.stop()  # SIGTERM reaches it at once, not SIGKILL after the grace
    assert process.exit_code() == 3


def test_a_recorded_pid_is_only_signalled_while_it_runs_the_recorded_command(
    tmp_path: Path,
) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True
    )
    try:
        assert not terminate_recorded(child.pid, "llm_router", grace_s=1)  # not ours
        assert pid_alive(child.pid)
        assert terminate_recorded(child.pid, "time.sleep", grace_s=5)
        assert child.wait(timeout=5) != 0
    finally:
        child.kill()


def test_state_round_trip(tmp_path: Path) -> None:
    state = StackState(
        123,
        "now",
        {"edge_http": "127.0.0.1:8080"},
        [ProcessRecord("auth", 9, "llm_auth", "log", 50051, 9151)],
    )
    write_state(tmp_path, state)
    assert read_state(tmp_path) == state
    clear_state(tmp_path)
    assert read_state(tmp_path) is None


def test_an_exited_unreaped_child_is_not_alive() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 10
    while pid_alive(child.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not pid_alive(child.pid)  # a zombie until wait() below
    assert child.wait(timeout=5) == 0


def test_every_process_starts_with_the_grpc_runtime_unless_overridden(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = StackConfig.from_env(REPO, {"LLM_RUN_DIR": str(tmp_path)})
    monkeypatch.delenv("GRPC_EXPERIMENTS", raising=False)
    assert {k: base_env(config)[k] for k in GRPC_RUNTIME_ENV} == dict(GRPC_RUNTIME_ENV)
    monkeypatch.setenv("GRPC_EXPERIMENTS", "")
    assert base_env(config)["GRPC_EXPERIMENTS"] == ""


def test_services_listen_on_loopback_unless_overridden(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = StackConfig.from_env(REPO, {"LLM_RUN_DIR": str(tmp_path)})
    monkeypatch.delenv("BIND_HOST", raising=False)
    assert base_env(config)["BIND_HOST"] == "127.0.0.1"
    monkeypatch.setenv("BIND_HOST", "[::]")
    assert base_env(config)["BIND_HOST"] == "[::]"
