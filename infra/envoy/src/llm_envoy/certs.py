"""Development certificates: a throw-away CA, the edge's server certificate and a mesh one.

Made with the `cryptography` package when it is installed, else with the openssl command.
Never for production: the CA key sits next to the certificates.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

EDGE_DNS_NAMES = ("localhost", "gateway.llm.local")
EDGE_IPS = ("127.0.0.1",)
DEFAULT_DAYS = 30
RENEW_BEFORE_DAYS = 2


@dataclass(frozen=True, slots=True)
class DevPki:
    """Where the files are (all PEM): ca.crt, edge.crt/.key and mesh.crt/.key."""

    directory: Path

    @property
    def ca(self) -> Path:
        return self.directory / "ca.crt"

    @property
    def edge_cert(self) -> Path:
        return self.directory / "edge.crt"

    @property
    def edge_key(self) -> Path:
        return self.directory / "edge.key"

    @property
    def mesh_cert(self) -> Path:
        return self.directory / "mesh.crt"

    @property
    def mesh_key(self) -> Path:
        return self.directory / "mesh.key"

    def files(self) -> tuple[Path, ...]:
        return (self.ca, self.edge_cert, self.edge_key, self.mesh_cert, self.mesh_key)


def ensure_dev_pki(directory: Path, *, mesh_identity: str, days: int = DEFAULT_DAYS) -> DevPki:
    """The PKI in `directory`, made afresh when a file is missing or the edge certificate
    expires within RENEW_BEFORE_DAYS."""
    pki = DevPki(directory)
    if all(p.is_file() for p in pki.files()) and not _expiring(pki.edge_cert):
        return pki
    directory.mkdir(parents=True, exist_ok=True)
    try:
        import cryptography  # noqa: F401
    except ImportError:
        _make_with_openssl(pki, mesh_identity, days)
    else:
        _make_with_cryptography(pki, mesh_identity, days)
    for key in (pki.edge_key, pki.mesh_key, directory / "ca.key"):
        os.chmod(key, 0o600)
    return pki


def _expiring(cert: Path) -> bool:
    try:
        from cryptography import x509
    except ImportError:
        # openssl answers 1 when the certificate expires within the window.
        seconds = str(RENEW_BEFORE_DAYS * 86_400)
        args = ["openssl", "x509", "-checkend", seconds, "-noout", "-in", str(cert)]
        return subprocess.run(args, capture_output=True, check=False).returncode != 0
    loaded = x509.load_pem_x509_certificate(cert.read_bytes())
    margin = datetime.timedelta(days=RENEW_BEFORE_DAYS)
    return loaded.not_valid_after_utc - margin < datetime.datetime.now(datetime.UTC)


def _make_with_cryptography(pki: DevPki, mesh_identity: str, days: int) -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC) - datetime.timedelta(minutes=5)
    until = now + datetime.timedelta(days=days)

    def name(common_name: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])

    def key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
        return key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(name("llm-platform dev CA"))
        .issuer_name(name("llm-platform dev CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(until)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(ca_key, hashes.SHA256())
    )

    def leaf(
        common_name: str, sans: list[x509.GeneralName], usage: list[x509.ObjectIdentifier]
    ) -> tuple[bytes, bytes]:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (
            x509.CertificateBuilder()
            .subject_name(name(common_name))
            .issuer_name(ca.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now)
            .not_valid_after(until)
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.ExtendedKeyUsage(usage), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .sign(ca_key, hashes.SHA256())
        )
        return cert.public_bytes(serialization.Encoding.PEM), key_pem(key)

    edge_sans: list[x509.GeneralName] = [x509.DNSName(d) for d in EDGE_DNS_NAMES]
    edge_sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in EDGE_IPS]
    edge = leaf("gateway.llm.local", edge_sans, [ExtendedKeyUsageOID.SERVER_AUTH])
    mesh = leaf(
        "mesh",
        [x509.UniformResourceIdentifier(mesh_identity)],
        [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH],
    )
    _write(pki.directory / "ca.key", key_pem(ca_key))
    _write(pki.ca, ca.public_bytes(serialization.Encoding.PEM))
    _write(pki.edge_cert, edge[0])
    _write(pki.edge_key, edge[1])
    _write(pki.mesh_cert, mesh[0])
    _write(pki.mesh_key, mesh[1])


def _write(path: Path, data: bytes) -> None:
    # Write then rename: a running Envoy never reads half a file.
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(path)


def _make_with_openssl(pki: DevPki, mesh_identity: str, days: int) -> None:
    openssl = shutil.which("openssl")
    if openssl is None:
        raise RuntimeError("neither the cryptography package nor the openssl command is available")
    d = pki.directory

    def run(*args: str) -> None:
        subprocess.run([openssl, *args], check=True, capture_output=True)

    ec_key = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes")
    run("req", "-x509", *ec_key, "-keyout", str(d / "ca.key"), "-out", str(pki.ca),
        "-days", str(days), "-subj", "/CN=llm-platform dev CA",
        "-addext", "basicConstraints=critical,CA:TRUE,pathlen:0")  # fmt: skip
    edge_san = ",".join([*(f"DNS:{n}" for n in EDGE_DNS_NAMES), *(f"IP:{i}" for i in EDGE_IPS)])
    for stem, cn, san, usage in (
        ("edge", "gateway.llm.local", edge_san, "serverAuth"),
        ("mesh", "mesh", f"URI:{mesh_identity}", "serverAuth,clientAuth"),
    ):
        with tempfile.TemporaryDirectory() as tmp:
            csr, ext = Path(tmp) / "req.csr", Path(tmp) / "ext.cnf"
            ext.write_text(f"subjectAltName={san}\nextendedKeyUsage={usage}\n")
            run("req", "-new", *ec_key, "-keyout", str(d / f"{stem}.key"), "-out", str(csr),
                "-subj", f"/CN={cn}")  # fmt: skip
            run("x509", "-req", "-in", str(csr), "-CA", str(pki.ca), "-CAkey", str(d / "ca.key"),
                "-CAcreateserial", "-out", str(d / f"{stem}.crt"), "-days", str(days),
                "-extfile", str(ext))  # fmt: skip
