"""What a local (one-host) config is rendered from, kept beside it as `layout.json`, so that
`mesh-apply` re-renders the running Envoy's config with only the policy changed."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from llm_envoy.layouts import LOOPBACK, LocalPorts, local_layout
from llm_envoy.local_mtls import with_mesh_tls
from llm_envoy.policy_model import MeshPolicy
from llm_envoy.topology import Endpoint, Layout

SPEC_FILE = "layout.json"


@dataclass(frozen=True, slots=True)
class LocalSpec:
    """The arguments of `layouts.local_layout`, the policy apart."""

    ports: LocalPorts = field(default_factory=LocalPorts)
    otlp: Endpoint | None = None
    admin_tenant: str = "system"
    listen_host: str = LOOPBACK
    mesh_tls: bool = False  # MESH_MTLS=1: mTLS to every service and on the mesh listener

    def layout(self, policy: MeshPolicy) -> Layout:
        layout = local_layout(
            self.ports,
            otlp=self.otlp,
            admin_tenant=self.admin_tenant,
            listen_host=self.listen_host,
            policy=policy,
        )
        return with_mesh_tls(layout) if self.mesh_tls else layout

    @property
    def admin(self) -> str:
        return f"127.0.0.1:{self.ports.admin}"

    def write(self, workdir: Path) -> Path:
        data = asdict(self)
        data["ports"]["grpc"] = dict(self.ports.grpc)
        path = workdir / SPEC_FILE
        path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
        return path

    @classmethod
    def read(cls, workdir: Path) -> LocalSpec:
        path = workdir / SPEC_FILE
        if not path.is_file():
            raise FileNotFoundError(f"{path}: not a rendered Envoy directory (no {SPEC_FILE})")
        data = json.loads(path.read_text(encoding="utf-8"))
        ports = data["ports"]
        ports["inference"] = tuple(ports["inference"])
        otlp = data["otlp"]
        return cls(
            ports=LocalPorts(**ports),
            otlp=None if otlp is None else Endpoint(otlp["host"], otlp["port"]),
            admin_tenant=data["admin_tenant"],
            listen_host=data["listen_host"],
            mesh_tls=bool(data.get("mesh_tls", False)),  # absent: rendered before the option
        )
