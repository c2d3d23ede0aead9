"""`make up MESH_MTLS=1`: a certificate per process of the stack, from Envoy's development CA
(llm_envoy.certs), made afresh at every start (the CA may have been renewed).

Each service's certificate carries its SPIFFE id (`spiffe://llm.local/ns/local/sa/<name>`, what
Envoy checks) and 127.0.0.1 (what a gRPC client checks); the keys are 0600 under the secrets
directory. Envoy's mesh listener gets one naming 127.0.0.1 (the router's channel checks it).
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from llm_common.server_tls import ServerTls
from llm_envoy.certs import DevPki
from llm_envoy.local_mtls import LISTENER_CERT, identity

DAYS = 30
WORKLOADS = ("auth", "tokenizer", "cache", "billing", "router", "inference")


@dataclass(frozen=True, slots=True)
class MeshPki:
    """Where each workload's certificate and key are, and the CA that signed them."""

    directory: Path
    ca: Path
    envoy_cert: Path  # Envoy's mesh certificate: the stack's probes present it too
    envoy_key: Path

    def tls_for(self, workload: str) -> ServerTls:
        folder = self.directory
        return ServerTls(folder / f"{workload}.crt", folder / f"{workload}.key", self.ca)

    def env_for(self, workload: str) -> dict[str, str]:
        """GRPC_TLS_* for a process of `workload`."""
        tls = self.tls_for(workload)
        return {
            "GRPC_TLS_CERT_FILE": str(tls.cert),
            "GRPC_TLS_KEY_FILE": str(tls.key),
            "GRPC_TLS_CLIENT_CA_FILE": str(tls.client_ca),
        }

    @property
    def probe_tls(self) -> ServerTls:
        return ServerTls(self.envoy_cert, self.envoy_key, self.ca)


def mesh_paths(run_dir: Path) -> MeshPki:
    """Where a running MESH_MTLS=1 stack keeps its certificates (`status` probes with them)."""
    envoy = DevPki(run_dir / "envoy" / "certs")
    return MeshPki(run_dir / "secrets" / "mesh", envoy.ca, envoy.mesh_cert, envoy.mesh_key)


def issue_mesh_certificates(envoy_pki: DevPki, directory: Path) -> MeshPki:
    """Certificates for every workload in `directory` and for Envoy's mesh listener in
    Envoy's certs/, signed by `envoy_pki`'s CA."""
    ca_cert = x509.load_pem_x509_certificate(envoy_pki.ca.read_bytes())
    ca_key = serialization.load_pem_private_key(
        (envoy_pki.directory / "ca.key").read_bytes(), password=None
    )
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise ValueError("the development CA key is not an EC key")
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    both = [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
    for workload in WORKLOADS:
        _issue(ca_cert, ca_key, identity(workload), both, directory / workload)
    listener = envoy_pki.directory.parent / LISTENER_CERT
    _issue(
        ca_cert, ca_key, identity("stack"), [ExtendedKeyUsageOID.SERVER_AUTH],
        listener.with_suffix(""),
    )  # fmt: skip
    return MeshPki(directory, envoy_pki.ca, envoy_pki.mesh_cert, envoy_pki.mesh_key)


def _issue(
    ca_cert: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    spiffe: str,
    usage: list[x509.ObjectIdentifier],
    stem: Path,
) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    sans: list[x509.GeneralName] = [
        x509.UniformResourceIdentifier(spiffe),
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        x509.DNSName("localhost"),
    ]
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, spiffe.rsplit("/")[-1])]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=DAYS))
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.ExtendedKeyUsage(usage), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    _write(stem.with_suffix(".crt"), cert.public_bytes(serialization.Encoding.PEM), 0o644)
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    _write(stem.with_suffix(".key"), pem, 0o600)


def _write(path: Path, data: bytes, mode: int) -> None:
    """Replace `path` with `data`, created with `mode` (a key is never readable by others)."""
    temporary = path.with_name(f".{path.name}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(temporary, mode)
    os.replace(temporary, path)
