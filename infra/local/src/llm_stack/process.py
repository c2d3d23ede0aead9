"""A child process with its own log file, started in its own session and stopped gracefully."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

LOG_TAIL_BYTES = 4000


@dataclass(frozen=True, slots=True)
class ProcessSpec:
    """How to run one process of the stack."""

    name: str
    argv: Sequence[str]
    env: Mapping[str, str]
    cwd: Path
    log: Path
    grpc_port: int | None = None
    metrics_port: int | None = None
    health_service: str = ""  # grpc.health.v1 service to wait for ("" = the server)
    grace_s: float = 15.0  # SIGTERM to SIGKILL
    meta: Mapping[str, str] = field(default_factory=dict)

    @property
    def signature(self) -> str:
        """What its command line contains: the module of `python -m`, else the program."""
        argv = list(self.argv)
        return argv[2] if len(argv) > 2 and argv[1] == "-m" else argv[0]


class ManagedProcess:
    """One running child. It gets its own session, so a Ctrl-C in the terminal reaches only
    the supervisor, which then stops the children in order."""

    def __init__(self, spec: ProcessSpec) -> None:
        self.spec = spec
        self._popen: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return None if self._popen is None else self._popen.pid

    def start(self) -> None:
        self.spec.log.parent.mkdir(parents=True, exist_ok=True)
        with self.spec.log.open("ab") as log:
            log.write(f"--- start {time.strftime('%Y-%m-%dT%H:%M:%S')} ---\n".encode())
            log.flush()
            self._popen = subprocess.Popen(
                list(self.spec.argv),
                env=dict(self.spec.env),
                cwd=self.spec.cwd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def alive(self) -> bool:
        return self._popen is not None and self._popen.poll() is None

    def exit_code(self) -> int | None:
        return None if self._popen is None else self._popen.poll()

    def signal(self, sig: int) -> None:
        if self.alive():
            assert self._popen is not None
            self._popen.send_signal(sig)

    def freeze(self) -> None:
        """SIGSTOP: the process keeps its sockets but answers nothing (a hung peer)."""
        self.signal(signal.SIGSTOP)

    def thaw(self) -> None:
        """SIGCONT: a frozen process runs on; a no-op for one that was not frozen."""
        self.signal(signal.SIGCONT)

    def wait(self, timeout_s: float) -> bool:
        """Whether it exited within `timeout_s`."""
        if self._popen is None:
            return True
        try:
            self._popen.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return False
        return True

    def stop(self) -> None:
        """SIGTERM (the services drain: health NOT_SERVING, then grace), SIGKILL after grace."""
        if not self.alive():
            return
        self.signal(signal.SIGTERM)
        self.thaw()  # a frozen process would only see the SIGTERM after its grace
        if not self.wait(self.spec.grace_s):
            self.kill()

    def kill(self) -> None:
        if self.alive():
            assert self._popen is not None
            self._popen.kill()
            self._popen.wait()

    def log_tail(self, limit: int = LOG_TAIL_BYTES) -> str:
        return log_tail(self.spec.log, limit)


def log_tail(path: Path, limit: int = LOG_TAIL_BYTES) -> str:
    """The last `limit` bytes of a log, for error messages."""
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - limit))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def pid_alive(pid: int) -> bool:
    """Whether `pid` runs; a zombie (exited, not yet reaped by its parent) does not."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no procfs: trust the signal test
    return stat.rpartition(")")[2].split()[0] != "Z"


def pid_command(pid: int) -> str:
    """The command line of `pid` ("" if gone): checked before signalling a recorded pid,
    which the system may have reused."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def terminate_recorded(pid: int, expected: str, grace_s: float) -> bool:
    """SIGTERM a recorded pid whose command line still contains `expected`, SIGKILL after
    `grace_s`. Whether it was running."""
    if not pid_alive(pid) or expected not in pid_command(pid):
        return False
    os.killpg(pid, signal.SIGTERM) if _leads_group(pid) else os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if not pid_alive(pid) or not pid_command(pid):
            return True
        time.sleep(0.1)  # polling another session's process: nothing to wait on
    if pid_alive(pid):
        os.kill(pid, signal.SIGKILL)
    return True


def _leads_group(pid: int) -> bool:
    try:
        return os.getpgid(pid) == pid
    except ProcessLookupError:
        return False
