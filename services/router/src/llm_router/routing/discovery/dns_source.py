"""DNS discovery: the A and AAAA records of a headless Service name, re-resolved on an
interval; one replica per address at the deployment's port."""

from __future__ import annotations

import asyncio
import time

import dns.asyncresolver
import dns.exception
import dns.resolver

from llm_common.logging import get_logger
from llm_common.models_config import Discovery

_log = get_logger(__name__)
RESOLVE_TIMEOUT_S = 2.0


class DnsSource:
    """Addresses of `discovery.service`; a lookup that fails keeps the last answer (a DNS
    hiccup must not empty the deployment), a name with no records empties it."""

    def __init__(self, discovery: Discovery) -> None:
        self._discovery = discovery
        self._resolver = _resolver(discovery.nameserver)
        self._last: frozenset[str] | None = None
        self._due = 0.0

    async def next(self, timeout_s: float) -> frozenset[str] | None:
        """The address set when it changed (the first call: the initial set), waiting at most
        `timeout_s` for the next lookup; None when nothing changed."""
        wait = self._due - time.monotonic()
        if wait > timeout_s:
            await asyncio.sleep(timeout_s)
            return None
        await asyncio.sleep(max(wait, 0.0))
        self._due = time.monotonic() + self._discovery.interval_s
        found = await self._resolve()
        if found is None or found == self._last:
            return None
        self._last = found
        return found

    def close(self) -> None:
        """Nothing held open between lookups."""

    async def _resolve(self) -> frozenset[str] | None:
        port = self._discovery.port
        found: set[str] = set()
        for rdtype in ("A", "AAAA"):
            try:
                answer = await self._resolver.resolve(
                    self._discovery.service, rdtype, lifetime=RESOLVE_TIMEOUT_S
                )
            except (dns.resolver.NXDOMAIN, dns.resolver.NoAnswer):
                continue
            except dns.exception.DNSException as err:
                _log.warning("dns lookup failed", name=self._discovery.service, error=str(err))
                return None
            for record in answer:
                address = record.to_text()
                found.add(f"[{address}]:{port}" if rdtype == "AAAA" else f"{address}:{port}")
        return frozenset(found)


def _resolver(nameserver: str) -> dns.asyncresolver.Resolver:
    if not nameserver:
        return dns.asyncresolver.Resolver()  # the system's (resolv.conf: the cluster DNS)
    host, _, port = nameserver.rpartition(":")
    resolver = dns.asyncresolver.Resolver(configure=False)
    resolver.nameservers = [host]
    resolver.port = int(port)
    return resolver
