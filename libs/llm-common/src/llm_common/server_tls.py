"""Mutual TLS on a service's own gRPC port (docs/adr/0018).

A service's port trusts the identity headers the edge set, so on one host any local process
that can connect could forge them. With GRPC_TLS_CERT_FILE, GRPC_TLS_KEY_FILE and
GRPC_TLS_CLIENT_CA_FILE set the port speaks TLS only and refuses every caller without a
certificate from that CA: in practice the mesh's Envoy, which presents its mesh certificate.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import grpc

from llm_common.config import ConfigError, env_str

TLS_VARIABLES = ("GRPC_TLS_CERT_FILE", "GRPC_TLS_KEY_FILE", "GRPC_TLS_CLIENT_CA_FILE")


@dataclass(frozen=True, slots=True)
class ServerTls:
    """The port's certificate and key, and the CA a caller's certificate must chain to."""

    cert: Path
    key: Path
    client_ca: Path

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> ServerTls | None:
        """All three variables, or none (plaintext); ConfigError naming the missing one."""
        values = {name: env_str(environ, name) for name in TLS_VARIABLES}
        given = [name for name, value in values.items() if value is not None]
        if not given:
            return None
        for name, value in values.items():
            if value is None:
                raise ConfigError.for_variable(name, f"is required with {given[0]}")
            if not Path(value).is_file():
                raise ConfigError.for_variable(name, "names no readable file")
        cert, key, ca = (Path(str(values[name])) for name in TLS_VARIABLES)
        return cls(cert=cert, key=key, client_ca=ca)

    def credentials(self) -> grpc.ServerCredentials:
        """TLS that demands and verifies a client certificate."""
        return grpc.ssl_server_credentials(
            [(self.key.read_bytes(), self.cert.read_bytes())],
            root_certificates=self.client_ca.read_bytes(),
            require_client_auth=True,
        )

    def channel_credentials(self) -> grpc.ChannelCredentials:
        """This process calling another mesh member: it presents its own certificate and
        trusts the mesh CA (the peer's certificate names 127.0.0.1 for the host check)."""
        return grpc.ssl_channel_credentials(
            root_certificates=self.client_ca.read_bytes(),
            private_key=self.key.read_bytes(),
            certificate_chain=self.cert.read_bytes(),
        )

    def http_context(self) -> ssl.SSLContext:
        """The same demand on an HTTP listener (the router's OpenAI front end)."""
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(self.client_ca))
        context.load_cert_chain(str(self.cert), str(self.key))
        context.verify_mode = ssl.CERT_REQUIRED
        return context
