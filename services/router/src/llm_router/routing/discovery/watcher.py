"""Keeps each dynamically discovered deployment's replicas current: found addresses are
probed (Gate) before they join the Fleet and get a load stream; addresses that disappear
leave it at once (their running requests finish or migrate)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol

from llm_common.logging import get_logger
from llm_common.models_config import Deployment, Discovery, ModelCatalog
from llm_router.routing.discovery.dns_source import DnsSource
from llm_router.routing.discovery.file_source import FileSource
from llm_router.routing.discovery.fleet import Fleet
from llm_router.routing.discovery.gate import Gate, Prober
from llm_router.routing.discovery.k8s_source import EndpointSliceSource, in_cluster_client

_log = get_logger(__name__)
# How often replicas found but not admitted yet (starting, or refused) are probed again.
RETRY_S = 1.0
FIRST_ROUND_S = 5.0  # the most a starting router waits for its first discovered replicas


class Source(Protocol):
    async def next(self, timeout_s: float) -> frozenset[str] | None: ...

    def close(self) -> None: ...


class LoadStreams(Protocol):
    def watch(self, replica: str) -> None: ...

    def unwatch(self, replica: str) -> None: ...


class DeploymentWatch:
    """One deployment: its source's address sets applied to the fleet."""

    def __init__(
        self, deployment: Deployment, source: Source, gate: Gate, fleet: Fleet, load: LoadStreams
    ) -> None:
        self.deployment = deployment
        self._source = source
        self._gate = gate
        self._fleet = fleet
        self._load = load
        self._found: frozenset[str] = frozenset()
        self.settled = asyncio.Event()  # the first address set was applied

    async def run(self) -> None:
        try:
            while True:
                found = await self._source.next(RETRY_S)
                if found is not None:
                    self._found = found
                await self.apply(self._found)
                if found is not None:
                    self.settled.set()
        finally:
            self._source.close()

    async def apply(self, found: frozenset[str]) -> None:
        current = set(self._fleet.replicas(self.deployment))
        for replica in current - found:
            self._fleet.remove(self.deployment, replica)
            self._load.unwatch(replica)
            self._gate.forget(replica)
            _log.info("replica left", replica=replica, deployment=self.deployment.name)
        candidates = sorted(found - current)
        verdicts = await asyncio.gather(*(self._gate.admit(r) for r in candidates))
        for replica, admitted in zip(candidates, verdicts, strict=True):
            if admitted:
                self._fleet.admit(self.deployment, replica)
                self._load.watch(replica)
                _log.info("replica joined", replica=replica, deployment=self.deployment.name)


class DiscoveryWatcher:
    """Runs a DeploymentWatch for every dns or kubernetes deployment of the catalogue."""

    def __init__(self, watches: list[DeploymentWatch], fleet: Fleet) -> None:
        self.watches = watches
        self.fleet = fleet
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self, settle_s: float = FIRST_ROUND_S) -> None:
        """Start watching; wait (at most `settle_s`) until each deployment's first addresses
        are probed, so a router that starts serving has replicas to place requests on."""
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(w.run()) for w in self.watches]
        if self.watches:
            settled = [asyncio.ensure_future(w.settled.wait()) for w in self.watches]
            _, pending = await asyncio.wait(settled, timeout=settle_s)
            for waiter in pending:
                waiter.cancel()
            if pending:
                _log.warning("discovery found no replicas yet", deployments=len(pending))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []


def build_discovery(
    catalog: ModelCatalog,
    prober: Prober,
    fleet: Fleet,
    load: LoadStreams,
    kube_client: Callable[[], Any] = in_cluster_client,
) -> DiscoveryWatcher:
    """A watcher over every dynamically discovered deployment in `catalog`."""
    watches = []
    for spec in catalog.models.values():
        for deployment in spec.deployments:
            found = deployment.discovery
            if not found.dynamic:
                continue
            source = _source(found, kube_client)
            gate = Gate(prober, spec.name, deployment.name, found.weights_digest)
            watches.append(DeploymentWatch(deployment, source, gate, fleet, load))
    return DiscoveryWatcher(watches, fleet)


def _source(found: Discovery, kube_client: Callable[[], Any]) -> Source:
    if found.kind == "dns":
        return DnsSource(found)
    if found.kind == "file":
        return FileSource(found)
    return EndpointSliceSource(found, kube_client)
