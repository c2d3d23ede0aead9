"""TLS for the auto-pipelined connections (RedisMux, ClusterMux): the same certificates and
checks as the redis-py client they are made from, so `rediss://` means one thing everywhere."""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from typing import Any

import redis.asyncio
from redis.asyncio.connection import SSLConnection


def speaks_tls(connection_class: Any) -> bool:
    """Whether a redis-py pool of `connection_class` connects with TLS."""
    return isinstance(connection_class, type) and issubclass(connection_class, SSLConnection)


def tls_context(connection_kwargs: Mapping[str, Any]) -> ssl.SSLContext:
    """The SSL context redis-py builds from a pool's `ssl_*` connection arguments (CA file or
    data, client certificate, verification mode, hostname check, minimum version)."""
    tls_args = {k: v for k, v in connection_kwargs.items() if k.startswith("ssl_")}
    context: ssl.SSLContext = SSLConnection(**tls_args).ssl_context.get()
    return context


def plain_or_tls(connection_class: Any) -> bool:
    """Whether the mux can speak a pool's protocol: plain TCP, a unix socket or TLS."""
    plain = (redis.asyncio.Connection, redis.asyncio.UnixDomainSocketConnection)
    return connection_class in plain or speaks_tls(connection_class)
