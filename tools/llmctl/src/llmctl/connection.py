"""Where and as whom llmctl calls: LLM_API_ADDR, LLM_API_KEY, TLS, and per-call metadata."""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import grpc

DEFAULT_ADDR = "127.0.0.1:8080"
Metadata = tuple[tuple[str, str | bytes], ...]


class UsageError(Exception):
    """A setting is missing or wrong; reported as one line, exit status 2."""


@dataclass(frozen=True, slots=True)
class Target:
    """The edge address; `https://` (or --tls) means TLS, verified against `ca_cert` if set."""

    address: str
    tls: bool = False
    ca_cert: Path | None = None

    @classmethod
    def parse(cls, raw: str, *, tls: bool = False, ca_cert: Path | None = None) -> Target:
        text = raw.strip()
        if text.startswith("https://"):
            text, tls = text.removeprefix("https://"), True
        text = text.removeprefix("http://").rstrip("/")
        host, _, port = text.rpartition(":")
        if not host or not port.isdigit():
            raise UsageError(f"LLM_API_ADDR must be host:port (optionally https://), got {raw!r}")
        return cls(text, tls, ca_cert)

    def channel(self) -> grpc.Channel:
        if not self.tls:
            return grpc.insecure_channel(self.address)
        roots = None
        if self.ca_cert is not None:
            try:
                roots = self.ca_cert.read_bytes()
            except OSError as exc:
                raise UsageError(
                    f"cannot read the CA certificate {self.ca_cert}: {exc.strerror}"
                ) from None
        return grpc.secure_channel(
            self.address, grpc.ssl_channel_credentials(root_certificates=roots)
        )


def new_traceparent() -> tuple[str, str]:
    """A W3C traceparent starting a sampled trace, and its trace id (printed after a call, so
    the request can be found in the traces of Envoy and every service)."""
    trace_id = secrets.token_hex(16)
    return f"00-{trace_id}-{secrets.token_hex(8)}-01", trace_id


@dataclass(frozen=True, slots=True)
class Credentials:
    api_key: str | None
    admin_key: str | None

    @classmethod
    def from_env(cls, environ: Mapping[str, str], api_key: str | None = None) -> Credentials:
        key = api_key or environ.get("LLM_API_KEY") or None
        admin = environ.get("LLM_ADMIN_KEY") or key
        return cls(key, admin)

    def metadata(self, *, admin: bool = False) -> Metadata:
        key = self.admin_key if admin else self.api_key
        if not key:
            variable = "LLM_ADMIN_KEY (or LLM_API_KEY)" if admin else "LLM_API_KEY"
            raise UsageError(f"set {variable} to an API key (`make up` prints one)")
        return (("authorization", f"Bearer {key}"),)


def target_from_env(environ: Mapping[str, str] = os.environ, addr: str | None = None) -> Target:
    raw = addr or environ.get("LLM_API_ADDR") or DEFAULT_ADDR
    ca = environ.get("LLM_CA_CERT")
    return Target.parse(raw, tls=bool(ca), ca_cert=Path(ca) if ca else None)
