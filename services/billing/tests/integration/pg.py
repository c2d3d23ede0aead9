"""PostgreSQL for the usage store tests: a uuid-named database on the shared server
(BILLING_TEST_POSTGRES, default postgresql://postgres@127.0.0.1:5432), or a throwaway
server of the test's own (initdb + pg_ctl on a free port) that a test may stop and start."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import sqlalchemy as sa

SHARED = os.environ.get("BILLING_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432")


def _admin(url: str) -> sa.Engine:
    return sa.create_engine(
        url.replace("postgresql://", "postgresql+psycopg://") + "/postgres",
        isolation_level="AUTOCOMMIT",
        connect_args={"connect_timeout": 3},
    )


@contextmanager
def scratch_database(server: str = SHARED) -> Iterator[str]:
    """A new empty database on `server`, dropped afterwards; skips when unreachable."""
    admin = _admin(server)
    name = f"billing_test_{uuid.uuid4().hex[:12]}"
    try:
        with admin.connect() as conn:
            conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    except sa.exc.OperationalError:
        admin.dispose()
        pytest.skip(f"no PostgreSQL at {server}")
    try:
        yield f"{server}/{name}"
    finally:
        admin.dispose()  # a pooled connection may not have survived a restart of the server
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PrivatePostgres:
    """initdb into a temporary folder; start() / stop() with pg_ctl (fast shutdown)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.data = folder / "data"
        self.port = _free_port()
        self._as_user: list[str] = []
        if os.geteuid() == 0:  # initdb refuses root: run as the postgres user
            self._as_user = ["runuser", "-u", "postgres", "--"]
            shutil.chown(folder, "postgres")
        self._run(["initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust", "--no-sync"])

    @property
    def server(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}"

    def _run(self, argv: list[str]) -> None:
        subprocess.run([*self._as_user, *argv], check=True, capture_output=True, timeout=60)

    def start(self) -> None:
        options = f"-p {self.port} -k {self.folder} -c listen_addresses=127.0.0.1 -c fsync=off"
        log = self.folder / "pg.log"
        self._run(["pg_ctl", "-D", str(self.data), "-o", options, "-l", str(log), "-w", "start"])

    def stop(self, mode: str = "fast") -> None:
        self._run(["pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop"])


@contextmanager
def private_postgres() -> Iterator[PrivatePostgres]:
    """A server in a new folder of /tmp (pytest's are private to root; the server runs as
    the postgres user when the tests run as root), removed afterwards."""
    if shutil.which("initdb") is None or shutil.which("pg_ctl") is None:
        pytest.skip("initdb / pg_ctl not installed")
    folder = Path(tempfile.mkdtemp(prefix="billing-pg-"))
    try:
        pg = PrivatePostgres(folder)
        pg.start()
        try:
            yield pg
        finally:
            with contextlib.suppress(subprocess.CalledProcessError):  # already stopped
                pg.stop("immediate")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
