"""Start the stack in order, wait for health, keep it running, stop it in reverse order."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

from llm_common.redis_conn import is_cluster_url, redacted
from llm_common.resilience import backoff_delay
from llm_envoy.certs import ensure_dev_pki
from llm_envoy.local_spec import LocalSpec
from llm_envoy.policy import load_policy
from llm_envoy.render import render_local_spec
from llm_envoy.topology import Layout
from llm_stack import catalogue, probes, redis_cluster, scaling, specs
from llm_stack.config import StackConfig
from llm_stack.credentials import Credentials, ensure_credentials
from llm_stack.mesh_pki import MeshPki, issue_mesh_certificates
from llm_stack.models import ensure_checkpoints
from llm_stack.process import ManagedProcess
from llm_stack.redis_server import redis_spec
from llm_stack.redis_users import StackRedisUsers, ensure_redis_users
from llm_stack.state import ProcessRecord, StackState, clear_state, write_state

_log = logging.getLogger(__name__)
MAX_RESTARTS = 5
STABLE_AFTER_S = 60.0  # a process up this long has its restart count forgiven


class StackError(RuntimeError):
    """The stack could not start; the message names the component and ends with its log."""


@dataclass(frozen=True, slots=True)
class Endpoints:
    """Where a client reaches the stack."""

    edge_http: str
    edge_tls: str
    admin: str
    mesh: str
    router: str  # the router's gRPC port, bypassing Envoy (benchmarks)
    redis_url: str  # the stack's own Redis: as the probe user (PING only)
    ca_cert: Path
    metrics: dict[str, str] = field(default_factory=dict)  # process -> host:port
    grpc: dict[str, str] = field(default_factory=dict)  # process -> host:port

    @property
    def openai_base_url(self) -> str:
        return f"http://{self.edge_http}/v1"


@dataclass
class _Restart:
    count: int = 0
    due: float | None = None
    started: float = field(default_factory=time.monotonic)


class Stack:
    """The running platform. `start` returns once everything is healthy through the edge."""

    def __init__(self, config: StackConfig) -> None:
        self.config = config
        self.credentials: Credentials | None = None
        self._redis: ManagedProcess | None = None
        self._redis_users: StackRedisUsers | None = None  # the own Redis's ACL users
        self.mesh_pki: MeshPki | None = None  # MESH_MTLS=1
        self._cluster_nodes: list[ManagedProcess] = []  # REDIS_CLUSTER=1
        self._services: list[ManagedProcess] = []
        self._envoy: ManagedProcess | None = None
        self._restarts: dict[str, _Restart] = {}
        self._endpoints: Endpoints | None = None
        self._shared: specs.Shared | None = None
        self.scalable: scaling.Scalable | None = None  # what `make scale` resizes

    @property
    def endpoints(self) -> Endpoints:
        if self._endpoints is None:
            raise StackError("the stack is not started")
        return self._endpoints

    @property
    def envoy_dir(self) -> Path:
        return self.config.run_dir / "envoy"

    def processes(self) -> list[ManagedProcess]:
        envoy = [] if self._envoy is None else [self._envoy]
        redis = [] if self._redis is None else [self._redis]
        return [*redis, *self._cluster_nodes, *self._services, *envoy]

    def start(self) -> Endpoints:
        """Bring everything up; on failure stop what started and raise StackError."""
        try:
            return self._start()
        except (probes.NotReadyError, OSError, RuntimeError, ValueError) as exc:
            self.stop()
            raise StackError(str(exc)) from exc

    def _start(self) -> Endpoints:
        c = self.config
        (c.run_dir / "logs").mkdir(parents=True, exist_ok=True)
        replicas = catalogue.local_replicas(c.models_config)
        if c.build_model:
            ensure_checkpoints(
                c.root, c.models_config, c.model_root, replicas, c.run_dir / "logs" / "model.log"
            )
        self.credentials = ensure_credentials(c.run_dir / "secrets")
        if c.mesh_mtls:  # before any process starts: each gets its certificate
            pki = ensure_dev_pki(self.envoy_dir / "certs", mesh_identity=STACK_IDENTITY)
            self.mesh_pki = issue_mesh_certificates(pki, c.run_dir / "secrets" / "mesh")
        redis_url = self._start_redis()
        port_map = {r.port: c.ports.replica_port(r.port) for r in replicas}
        models = catalogue.write_copy(c.models_config, c.run_dir / "models.yaml", port_map)
        self.scalable = scaling.make_scalable(models, c.run_dir)
        shared = self._shared = specs.Shared(
            c, redis_url, models, self.credentials, self._redis_users, self.mesh_pki
        )
        service_specs = [
            *specs.core_specs(shared),
            *(specs.replica_spec(shared, r) for r in replicas),
        ]
        # The router reaches everything through the mesh, so it starts once Envoy is up (its
        # channels would otherwise begin in reconnect back-off); the rest start together.
        first = [ManagedProcess(s) for s in service_specs if s.name != "router"]
        router = [ManagedProcess(s) for s in service_specs if s.name == "router"]
        self._services = first
        self._start_and_wait(first)
        layout = self._start_envoy(replicas)
        self._services = [*first, *router]
        self._start_and_wait(router)
        self._wait_for_edge(layout)
        users = self._redis_users
        self._endpoints = self._make_endpoints(
            redis_url if users is None else users.probe_url(redis_url)
        )
        self._write_state()
        return self._endpoints

    def _start_and_wait(self, processes: list[ManagedProcess]) -> None:
        for process in processes:
            process.start()
        self._write_state()
        for process in processes:
            self._wait_serving(process)

    def _start_redis(self) -> str:
        c = self.config
        if c.redis_url is not None:
            return self._given_redis(c.redis_url)
        if c.redis_cluster:
            return self._start_cluster()
        # One ACL user per service, passwords kept in the secrets directory (never logged).
        users = self._redis_users = ensure_redis_users(c.run_dir / "secrets", c.redis_prefix)
        spec = redis_spec(c.run_dir, c.ports.redis, specs.base_env(c), users.acl_path)
        self._redis = ManagedProcess(spec)
        self._redis.start()
        url = spec.meta["url"]
        probe = users.probe_url(url)
        probes.wait_until(
            "redis", lambda: probes.redis_ready(probe), 30, lambda: _exited(self._redis)
        )
        return url

    def _given_redis(self, url: str) -> str:
        """REDIS_URL / REDIS_CLUSTER_NODES as given; with LLM_REDIS_USERS=1 the services
        connect there as their own users (the operator loaded redis-users.acl)."""
        c = self.config
        probe = url
        if c.redis_users:
            url = redacted(url)  # each service gets its own credentials instead
            users = self._redis_users = ensure_redis_users(c.run_dir / "secrets", c.redis_prefix)
            probe = users.probe_url(url)
        if not probes.redis_ready(probe):
            variable = "REDIS_CLUSTER_NODES" if is_cluster_url(url) else "REDIS_URL"
            raise StackError(f"{variable}: Redis at {redacted(url)} does not answer")
        return url

    def _start_cluster(self) -> str:
        """REDIS_CLUSTER=1: six supervised cluster nodes, joined once they answer."""
        c = self.config
        ports = redis_cluster.cluster_ports()
        env = specs.base_env(c)
        users = ensure_redis_users(c.run_dir / "secrets", c.redis_prefix, admin=True)
        self._redis_users = users
        nodes = [ManagedProcess(s) for s in redis_cluster.node_specs(c.run_dir, ports, env, users)]
        self._cluster_nodes = nodes
        for node in nodes:
            node.start()
        for node, port in zip(nodes, ports, strict=True):
            self._wait_node(node, users.probe_url(f"redis://127.0.0.1:{port}/0"))
        redis_cluster.create(ports, users)
        url = redis_cluster.cluster_url(ports)
        probe = users.probe_url(url)
        probes.wait_until("redis-cluster", lambda: probes.redis_ready(probe), 30, _never_failed)
        return url

    @staticmethod
    def _wait_node(node: ManagedProcess, url: str) -> None:
        probes.wait_until(
            node.spec.name, lambda: probes.redis_ready(url), 30, lambda: _exited(node)
        )

    def _wait_serving(self, process: ManagedProcess) -> None:
        spec = process.spec
        target = f"127.0.0.1:{spec.grpc_port}"
        tls = None if self.mesh_pki is None else self.mesh_pki.probe_tls
        probes.wait_until(
            spec.name,
            lambda: probes.grpc_serving(target, spec.health_service, tls=tls),
            self.config.start_timeout_s,
            lambda: _exited(process),
        )

    def _start_envoy(self, replicas: list[catalogue.LocalReplica]) -> Layout:
        c = self.config
        layout = render_envoy(c, replicas)
        envoy = self._envoy = ManagedProcess(specs.envoy_spec(c, self.envoy_dir))
        envoy.start()
        admin = f"127.0.0.1:{c.ports.envoy.admin}"
        probes.wait_until("envoy", lambda: probes.envoy_ready(admin), 30, lambda: _exited(envoy))
        self._wait_upstreams(layout, exclude=frozenset({"router"}))
        return layout

    def _wait_upstreams(self, layout: Layout, exclude: frozenset[str] = frozenset()) -> None:
        envoy = self._envoy
        admin = f"127.0.0.1:{self.config.ports.envoy.admin}"
        checked = {n for n, up in layout.upstreams.items() if up.health_service} - exclude
        probes.wait_until(
            "envoy upstream health",
            lambda: not probes.unhealthy_hosts(admin, checked),
            60,
            lambda: _exited(envoy),
        )

    def _wait_for_edge(self, layout: Layout) -> None:
        """Every cluster healthy in Envoy's eyes, and the router answering through the edge."""
        self._wait_upstreams(layout)
        envoy = self._envoy
        edge = f"127.0.0.1:{self.config.ports.envoy.edge_http}"
        probes.wait_until(
            "router through the edge", lambda: probes.grpc_serving(edge), 30, lambda: _exited(envoy)
        )

    def _make_endpoints(self, redis_url: str) -> Endpoints:
        ports = self.config.ports.envoy
        host = "127.0.0.1"
        return Endpoints(
            edge_http=f"{host}:{ports.edge_http}",
            edge_tls=f"localhost:{ports.edge_tls}",
            admin=f"{host}:{ports.admin}",
            mesh=f"{host}:{ports.mesh}",
            router=f"{host}:{ports.grpc['router']}",
            redis_url=redis_url,
            ca_cert=self.envoy_dir / "certs" / "ca.crt",
            metrics={
                p.spec.name: f"{host}:{p.spec.metrics_port}"
                for p in self._services
                if p.spec.metrics_port
            },
            grpc={
                p.spec.name: f"{host}:{p.spec.grpc_port}"
                for p in self._services
                if p.spec.grpc_port
            },
        )

    def _write_state(self) -> None:
        records = [
            ProcessRecord(
                name=p.spec.name,
                pid=p.pid or 0,
                command=p.spec.signature,
                log=str(p.spec.log),
                grpc_port=p.spec.grpc_port,
                metrics_port=p.spec.metrics_port,
                health_service=p.spec.health_service,
            )
            for p in self.processes()
            if p.pid is not None
        ]
        endpoints = {}
        if self._endpoints is not None:
            e = self._endpoints
            endpoints = {"edge_http": e.edge_http, "edge_tls": e.edge_tls, "admin": e.admin}
        state = StackState(os.getpid(), time.strftime("%Y-%m-%dT%H:%M:%S%z"), endpoints, records)
        write_state(self.config.run_dir, state)

    def supervise(self, stop: threading.Event, poll_s: float = 0.5) -> None:
        """Restart children that exit, with jittered exponential back-off, until `stop`."""
        while not stop.wait(poll_s):
            for process in self.processes():
                self._maybe_restart(process)
            wanted = scaling.take_request(self.config.run_dir)
            if wanted is not None:
                self._answer_scale(wanted)

    def scaled_replicas(self) -> list[ManagedProcess]:
        """The replicas of the model `make scale` resizes, in start order."""
        model = self.scalable.model if self.scalable is not None else None
        return [p for p in self._services if p.spec.env.get("INFERENCE_MODEL") == model]

    def scale(self, replicas: int) -> list[str]:
        """Start or stop replicas until `replicas` (at least 1) run; their addresses.
        Raises StackError when the stack has no scalable deployment or a replica fails."""
        if self.scalable is None or self._shared is None:
            raise StackError("no generation deployment with local replicas to scale")
        running = self.scaled_replicas()
        while len(running) < max(replicas, 1):
            process = ManagedProcess(scaling.extra_replica_spec(self._shared, self.scalable.model))
            self._services.append(process)
            process.start()
            self._write_state()
            self._wait_serving(process)  # listed only once it serves: the router probes it
            running.append(process)
            scaling.write_listing(self.scalable.listing, _addresses(running))
        while len(running) > max(replicas, 1):
            process = running.pop()
            scaling.write_listing(self.scalable.listing, _addresses(running))
            time.sleep(scaling.UNLIST_WAIT_S)  # the router stops choosing it
            process.stop()  # SIGTERM: it drains its streams, then exits
            self._services.remove(process)
            self._write_state()
        return _addresses(running)

    def _answer_scale(self, wanted: scaling.ScaleRequest) -> None:
        error = ""
        try:
            self.scale(wanted.replicas)
        except (StackError, probes.NotReadyError, OSError) as exc:
            error = str(exc)
            _log.warning("scale to %d failed: %s", wanted.replicas, exc)
        scaling.write_result(self.config.run_dir, wanted, _addresses(self.scaled_replicas()), error)

    def _maybe_restart(self, process: ManagedProcess) -> None:
        name = process.spec.name
        state = self._restarts.setdefault(name, _Restart())
        now = time.monotonic()
        if process.alive():
            if now - state.started > STABLE_AFTER_S:
                state.count = 0
            return
        if state.due is None:
            if state.count >= MAX_RESTARTS:
                return
            state.count += 1
            delay = backoff_delay(state.count, base=1.0, cap=30.0, jitter=1.0)
            state.due = now + delay
            _log.warning(
                "%s exited with code %s; restart %d in %.1f s (log: %s)",
                name, process.exit_code(), state.count, delay, process.spec.log,
            )  # fmt: skip
        elif now >= state.due:
            state.due, state.started = None, now
            process.start()
            self._write_state()

    def stop(self) -> None:
        """Router first (it settles billing through the mesh), then Envoy, the rest, Redis."""
        router = [p for p in self._services if p.spec.name == "router"]
        others = [p for p in self._services if p.spec.name != "router"]
        _stop_all(router)
        _stop_all([] if self._envoy is None else [self._envoy])
        _stop_all(others)
        _stop_all([] if self._redis is None else [self._redis])
        _stop_all(self._cluster_nodes)
        clear_state(self.config.run_dir)


MESH_POLICY = "infra/envoy/policy.yaml"
STACK_IDENTITY = "spiffe://llm.local/ns/local/sa/stack"  # Envoy's mesh certificate


def render_envoy(config: StackConfig, replicas: list[catalogue.LocalReplica]) -> Layout:
    """Envoy's working directory for this stack: envoy.yaml, proto/, logs/ and dev certs/."""
    workdir = config.run_dir / "envoy"
    ensure_dev_pki(workdir / "certs", mesh_identity=STACK_IDENTITY)
    generation = catalogue.generation_ports(replicas)
    balanced = tuple(config.ports.replica_port(p) for p in generation)
    spec = LocalSpec(
        replace(config.ports.envoy, inference=balanced),
        otlp=config.otlp,
        admin_tenant=config.admin_tenant,
        listen_host=config.listen_host,
        mesh_tls=config.mesh_mtls,
    )
    # The mesh policy `make mesh-apply` later swaps in without a restart.
    policy = load_policy(config.root / MESH_POLICY)
    render_local_spec(spec, workdir, config.root / "protos", policy)
    return spec.layout(policy)


def _addresses(processes: Iterable[ManagedProcess]) -> list[str]:
    return [f"127.0.0.1:{p.spec.grpc_port}" for p in processes]


def _stop_all(processes: Iterable[ManagedProcess]) -> None:
    """SIGTERM all at once, then wait for each (SIGKILL after its grace)."""
    chosen = [p for p in processes if p.alive()]
    for p in chosen:
        p.signal(signal.SIGTERM)
        p.thaw()  # a frozen (SIGSTOPped) child handles the SIGTERM only once continued
    for p in chosen:
        if not p.wait(p.spec.grace_s):
            p.kill()


def _exited(process: ManagedProcess | None) -> str | None:
    if process is None or process.alive():
        return None
    return f"exited with code {process.exit_code()}; log {process.spec.log}:\n{process.log_tail()}"


def _never_failed() -> str | None:
    return None
