"""bench_billing's values: an arm's samples, a client's work, a server, an arm's set-up."""

from __future__ import annotations

from dataclasses import dataclass, field

from billing_config import BATCH_IN_FLIGHT


@dataclass
class Arm:
    """Latencies (ms), wall time and CPU seconds (by process group) of one arm."""

    server_processes: int
    client_processes: int
    reserve: list[float] = field(default_factory=list)
    settle: list[float] = field(default_factory=list)
    pair: list[float] = field(default_factory=list)
    elapsed_s: float = 0.0
    settles: int = 0  # settle-only arms settle without pairs
    settle_calls: int = 0  # SettleBatch calls (batched arms); 0: one Settle call per pair
    cpu_s: dict[str, float] = field(default_factory=dict)
    server_cpu_by_process: list[float] = field(default_factory=list)  # supervisor first

    def add_cpu(self, name: str, seconds: float) -> None:
        self.cpu_s[name] = self.cpu_s.get(name, 0.0) + seconds


@dataclass(frozen=True)
class Work:
    """One client process's share of a round."""

    target: str
    prefix: str
    first: int  # request ids first, first + stride, ... below `count`
    stride: int
    count: int
    concurrency: int
    channels: int
    # unary | batched | settle_only | settle_stream | pair_stream | pair_stream_unary
    mode: str = "unary"
    rate_per_s: float = 0.0  # settle_stream, pair_stream: offered requests per second
    in_flight: int = BATCH_IN_FLIGHT  # the SettleBatcher's max_in_flight


@dataclass(frozen=True)
class Server:
    """A running `python -m llm_billing` (its supervisor pid when it has workers)."""

    target: str
    pid: int
    workers: int


@dataclass(frozen=True)
class Setup:
    """How one gRPC arm is run."""

    name: str
    server: Server
    client_processes: int
    channels_per_client: int
    mode: str = "unary"
    rate_per_s: float = 0.0  # settle_stream, pair_stream
    in_flight: int = BATCH_IN_FLIGHT  # the SettleBatcher's max_in_flight (batched, streams)
