"""One connection layer for both Redis topologies: a single node or a Redis Cluster.

Configuration (read by each service's settings loader, never at import time):

- `REDIS_URL` — a single node (`redis://`, `rediss://` or `unix://`), as before (the
  internal cluster form below is accepted here too).
- `REDIS_CLUSTER_NODES` — `host:port,host:port,...` seed nodes; when set, every service runs
  in cluster mode and REDIS_URL is ignored. Prefix the list with `rediss://` for TLS.
- `REDIS_USERNAME` / `REDIS_PASSWORD` — ACL credentials, in both modes (they fill in what
  the URL does not carry).
- `REDIS_TLS_CA_CERT` — a CA file to trust for `rediss://` (both modes; else the system's).

Inside the services both modes travel as one URL string: a cluster is written
`redis+cluster://[user:pass@]h1:p1,h2:p2` (`rediss+cluster://` for TLS), so settings,
tests and fixtures that pass a URL around need no second field. `open_client` turns such a
URL into redis-py's asyncio `RedisCluster`, typed as `redis.asyncio.Redis`: the command
methods the services call are the same (see docs/adr/0009-redis-cluster-connection-layer.md).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import parse_qs, quote, unquote, urlsplit

import redis
import redis.asyncio
import redis.cluster
import redis.exceptions
from redis.asyncio.cluster import ClusterNode, ClusterPipeline, RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff
from redis.exceptions import RedisClusterException

from llm_common.config import ConfigError, env_str

CLUSTER_SCHEMES = {"redis+cluster": False, "rediss+cluster": True}  # scheme -> TLS
SINGLE_SCHEMES = ("redis", "rediss", "unix")
URL_PREFIXES = ("redis://", "rediss://", "unix://", "redis+cluster://", "rediss+cluster://")
NODES_VAR = "REDIS_CLUSTER_NODES"
CA_VAR = "REDIS_TLS_CA_CERT"
URL_VAR = "REDIS_URL"


@dataclass(frozen=True, slots=True)
class ClusterTarget:
    """A parsed cluster URL: seed nodes, credentials and TLS."""

    nodes: tuple[tuple[str, int], ...]
    username: str | None
    password: str | None
    tls: bool
    ca_certs: str | None = None  # a CA file to trust (REDIS_TLS_CA_CERT), else the system's

    def url(self) -> str:
        """The `redis+cluster://` form of this target."""
        scheme = "rediss+cluster" if self.tls else "redis+cluster"
        auth = ""
        if self.password is not None:
            user = quote(self.username or "", safe="")
            auth = f"{user}:{quote(self.password, safe='')}@"
        elif self.username:
            auth = f"{quote(self.username, safe='')}@"
        query = f"?ssl_ca_certs={quote(self.ca_certs, safe='/')}" if self.ca_certs else ""
        return f"{scheme}://{auth}" + ",".join(f"{h}:{p}" for h, p in self.nodes) + query


def redacted(url: str) -> str:
    """`url` without its credentials (for messages and logs)."""
    scheme, sep, rest = url.partition("://")
    return f"{scheme}{sep}{rest.rpartition('@')[2]}" if sep else url


def is_cluster_url(url: str) -> bool:
    """Whether `url` names a Redis Cluster (`redis+cluster://...`)."""
    return url.split("://", 1)[0].lower() in CLUSTER_SCHEMES


def parse_nodes(value: str, variable: str = NODES_VAR) -> tuple[tuple[str, int], ...]:
    """`h1:p1,h2:p2` as (host, port) pairs; ConfigError naming `variable` when malformed."""
    nodes: list[tuple[str, int]] = []
    for part in (p.strip() for p in value.split(",")):
        if not part:
            continue
        host, sep, port = part.rpartition(":")
        host = host.strip("[]")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError.for_variable(variable, f"{part!r} is not host:port")
        nodes.append((host, int(port)))
    if not nodes:
        raise ConfigError.for_variable(variable, "names no host:port")
    return tuple(nodes)


def parse_cluster_url(url: str) -> ClusterTarget:
    """The seed nodes, credentials and TLS of a `redis+cluster://` URL."""
    scheme, _, rest = url.partition("://")
    if scheme.lower() not in CLUSTER_SCHEMES:
        raise ConfigError.for_variable(NODES_VAR, "not a redis+cluster:// URL")
    rest, _, query = rest.partition("?")
    ca_certs = parse_qs(query).get("ssl_ca_certs", [None])[-1]
    auth, _, hosts = rest.rpartition("@")
    username: str | None = None
    password: str | None = None
    if auth:
        user, sep, secret = auth.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if sep else None
    return ClusterTarget(
        nodes=parse_nodes(hosts.rstrip("/")),
        username=username,
        password=password,
        tls=CLUSTER_SCHEMES[scheme.lower()],
        ca_certs=ca_certs,
    )


def redis_url_from_env(environ: Mapping[str, str], default: str | None) -> str:
    """The Redis URL the environment asks for: a cluster URL when REDIS_CLUSTER_NODES is set,
    else REDIS_URL (or `default`); REDIS_USERNAME/REDIS_PASSWORD fill in credentials.
    ConfigError naming the variable when a value is malformed."""
    username = env_str(environ, "REDIS_USERNAME")
    password = env_str(environ, "REDIS_PASSWORD")
    ca_certs = env_str(environ, CA_VAR)
    nodes_value = env_str(environ, NODES_VAR)
    if nodes_value is not None:
        tls = False
        lowered = nodes_value.lower()
        for prefix, secure in (("rediss://", True), ("redis://", False)):
            if lowered.startswith(prefix):
                tls, nodes_value = secure, nodes_value[len(prefix) :]
        if "@" in nodes_value:
            raise ConfigError.for_variable(
                NODES_VAR, "must not carry credentials: use REDIS_USERNAME/REDIS_PASSWORD"
            )
        target = ClusterTarget(parse_nodes(nodes_value), username, password, tls, ca_certs)
        return target.url()
    url = env_str(environ, URL_VAR, default)
    if url is None:
        raise ConfigError.for_variable(URL_VAR, "is required but not set")
    if is_cluster_url(url):  # the internal form, accepted in REDIS_URL too
        try:
            parse_cluster_url(url)
        except ConfigError as exc:
            raise ConfigError.for_variable(URL_VAR, str(exc).split(": ", 1)[1]) from exc
        return url
    parts = urlsplit(url)
    if parts.scheme.lower() not in SINGLE_SCHEMES:
        raise ConfigError.for_variable(URL_VAR, "must be a redis://, rediss:// or unix:// URL")
    if ca_certs is not None and parts.scheme.lower() == "rediss":
        query = "&".join(q for q in (parts.query, f"ssl_ca_certs={quote(ca_certs, safe='/')}") if q)
        parts = parts._replace(query=query)
    if password is None or parts.password is not None or parts.scheme == "unix":
        return parts.geturl()
    host = parts.netloc.rpartition("@")[2]
    user = quote(username or parts.username or "", safe="")
    netloc = f"{user}:{quote(password, safe='')}@{host}"
    return parts._replace(netloc=netloc).geturl()


class BoundedRedisCluster(RedisCluster):
    """RedisCluster whose callers wait for a free connection, as a BlockingConnectionPool's
    do, instead of failing with MaxConnectionsError (redis-py's per-node pools never wait):
    at most `max_connections` commands or pipelines are in flight, so no node's pool is
    ever exhausted."""

    gate: asyncio.Semaphore

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        async with self.gate:
            return await super().execute_command(*args, **kwargs)

    def pipeline(self, transaction: Any | None = None, shard_hint: Any | None = None) -> Any:
        return _BoundedPipeline(self, transaction)  # type: ignore[abstract]  # as redis-py does


class _BoundedPipeline(ClusterPipeline):
    async def execute(self, *args: Any, **kwargs: Any) -> Any:
        client = cast(BoundedRedisCluster, self.cluster_client)
        async with client.gate:
            return await super().execute(*args, **kwargs)


def cluster_client(
    url: str,
    *,
    timeout_s: float,
    max_connections: int = 64,
    decode_responses: bool = False,
    retries: int = 3,
    **kwargs: Any,
) -> redis.asyncio.Redis:
    """redis-py's asyncio RedisCluster on the URL's seed nodes (it keeps the slot map, follows
    MOVED/ASK and refreshes the map after a failover). Typed as `redis.asyncio.Redis`: the
    services call the command methods both classes share (ADR 0009)."""
    target = parse_cluster_url(url)
    client = BoundedRedisCluster(
        startup_nodes=[ClusterNode(host, port) for host, port in target.nodes],
        username=target.username,
        password=target.password,
        ssl=target.tls,
        ssl_ca_certs=target.ca_certs,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        max_connections=max_connections,
        decode_responses=decode_responses,
        require_full_coverage=True,
        retry=Retry(ExponentialWithJitterBackoff(base=0.05, cap=0.5), retries),
        **kwargs,
    )
    client.gate = asyncio.Semaphore(max_connections)
    return cast(redis.asyncio.Redis, client)


def is_cluster_client(client: object) -> bool:
    """Whether `client` is a RedisCluster (made by `cluster_client`)."""
    return isinstance(client, RedisCluster)


def open_client(
    url: str, *, timeout_s: float, decode_responses: bool = False, max_connections: int = 64
) -> redis.asyncio.Redis:
    """A client for either topology, with short timeouts (tests, tools, probes)."""
    if is_cluster_url(url):
        return cluster_client(
            url,
            timeout_s=timeout_s,
            decode_responses=decode_responses,
            max_connections=max_connections,
        )
    return redis.asyncio.Redis.from_url(
        url,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        decode_responses=decode_responses,
    )


def open_sync_client(url: str, *, timeout_s: float = 5.0, decode_responses: bool = False) -> Any:
    """A blocking client for either topology (tests and tools): redis.Redis or
    redis.RedisCluster."""
    if is_cluster_url(url):
        target = parse_cluster_url(url)
        return redis.RedisCluster(
            startup_nodes=[redis.cluster.ClusterNode(h, p) for h, p in target.nodes],  # type: ignore[no-untyped-call]
            username=target.username,
            password=target.password,
            ssl=target.tls,
            ssl_ca_certs=target.ca_certs,
            socket_timeout=timeout_s,
            decode_responses=decode_responses,
        )
    return redis.Redis.from_url(url, socket_timeout=timeout_s, decode_responses=decode_responses)


async def ensure_ready(client: redis.asyncio.Redis, *, refresh: bool = False) -> None:
    """Load a RedisCluster's slot map (before pub/sub, which needs it); `refresh`: reload it
    (after a lost connection: a failover may have moved the slots). No-op on one node."""
    if isinstance(client, RedisCluster):
        if refresh and not client._initialize:  # redis-py: already initialised
            await client.nodes_manager.initialize()
        else:
            await client.initialize()


async def verify_redis(client: redis.asyncio.Redis, url: str) -> None:
    """PING the single node, or check that the cluster is reachable and serves every slot;
    ConfigError naming REDIS_CLUSTER_NODES or REDIS_URL (one line, no secrets) otherwise."""
    variable = NODES_VAR if is_cluster_url(url) else URL_VAR
    try:
        if is_cluster_client(client):
            cluster = cast(RedisCluster, client)
            await cluster.initialize()
            state = await cluster.cluster_info(target_nodes=RedisCluster.RANDOM)
            if str(_info_field(state, "cluster_state")) != "ok":
                raise ConfigError.for_variable(variable, "cluster_state is not ok")
        else:
            await client.ping()
    except ConfigError:
        raise
    except (redis.exceptions.RedisError, RedisClusterException, OSError) as exc:
        problem = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if "password" in problem.lower() or "@" in problem:
            problem = type(exc).__name__  # never echo credentials
        raise ConfigError.for_variable(variable, f"Redis unusable: {problem}") from exc


def _info_field(info: Any, name: str) -> Any:
    if isinstance(info, dict):
        if name in info:
            return info[name]
        for value in info.values():  # per-node replies
            if isinstance(value, dict) and name in value:
                return value[name]
    return None
