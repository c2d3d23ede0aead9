"""The auto-pipelined hot path on a Redis Cluster: one RedisMux per master.

A call's commands are grouped by the master that owns each command's slot (redis-py's slot
map, taken from the RedisCluster client) and each group goes down that master's RedisMux,
all groups at once; replies come back in the caller's order. Redirections:

- `MOVED` (the slot has another owner: a failover or a resharding): the command did not run;
  the slot map is refreshed once for all callers and the command is sent to the new owner.
- `ASK` (a slot being migrated): `ASKING` + the command go to the named node.
- A lost or refused connection to a master (it died): the map is refreshed in the
  background and the ConnectionError is raised, as RedisMux does, so the caller's retry
  policy (idempotent operations retry once) decides; once a replica is promoted the
  refreshed map sends the retry there.

Scripts: EVALSHA goes to the owner of its first key (every script touches one slot); a
NOSCRIPT reply is handed back so that the caller loads its scripts (SCRIPT LOAD through the
RedisCluster client reaches every master) and resends, as on one node.

`wait` (ReplicaWait): every master that received a command of the call gets a WAIT after it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from typing import Any

import redis.asyncio
from redis.asyncio.cluster import RedisCluster
from redis.crc import key_slot
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from llm_common.redis_mux import Command, Endpoint, RedisMux, ReplicaWait, Sent
from llm_common.redis_tls import speaks_tls, tls_context

MAX_REDIRECTS = 3
REFRESH_MIN_INTERVAL_S = 0.2  # a burst of MOVED replies refreshes the map once
# Commands whose first argument is not a key; sent to any master.
KEYLESS = frozenset({"PING", "WAIT", "SCRIPT", "INFO", "TIME", "ECHO", "CLUSTER", "ROLE"})
# Commands that need a connection of their own (they block, or subscribe); not for the mux.
SCRIPT_COMMANDS = frozenset({"EVAL", "EVALSHA", "EVAL_RO", "EVALSHA_RO", "FCALL", "FCALL_RO"})


def cluster_of(client: object) -> RedisCluster | None:
    """`client` as a RedisCluster, or None for a single-node client."""
    return client if isinstance(client, RedisCluster) else None


def mux_speaks(cluster: RedisCluster) -> bool:
    """Whether ClusterMux can reach the nodes (plain TCP or TLS)."""
    kind = cluster.nodes_manager.connection_kwargs.get("connection_class")
    return kind is None or kind is redis.asyncio.Connection or speaks_tls(kind)


def first_key(command: Command) -> str | bytes | None:
    """The key that decides where `command` goes (None: any master)."""
    name = str(command[0]).upper()
    if name in KEYLESS or len(command) < 2:
        return None
    if name in SCRIPT_COMMANDS:
        numkeys = int(command[2])
        return _as_key(command[3]) if numkeys > 0 else None
    return _as_key(command[1])


def _as_key(value: str | int) -> str | bytes:
    return value if isinstance(value, str) else str(value)


class ClusterMux:
    """The Pipelined interface over a RedisCluster (see the module docstring)."""

    def __init__(self, client: RedisCluster, *, decode: bool = True) -> None:
        self._client = client
        self._decode = decode
        self._muxes: dict[str, RedisMux] = {}
        self._refreshing = asyncio.Lock()
        self._refreshed_at = 0.0
        self._background: set[asyncio.Task[None]] = set()
        self._owners: dict[int, str] = {}  # slot -> master name, cleared on refresh

    async def execute(
        self, commands: Sequence[Command], *, wait: ReplicaWait | None = None
    ) -> list[Any]:
        if self._client._initialize:  # redis-py: not yet initialised
            await self._client.initialize()
        replies: list[Any] = [None] * len(commands)
        todo = list(range(len(commands)))
        asking: dict[int, str] = {}
        for attempt in range(MAX_REDIRECTS + 1):
            groups = self._group(commands, todo, asking)
            if len(groups) == 1:  # the common case: one slot owner, no task per group
                ((name, idx),) = groups.items()
                await self._run_group(name, idx, commands, asking, replies, wait)
                todo, asking = self._redirected(todo, replies)
                if not todo or attempt == MAX_REDIRECTS:
                    break
                if any(i not in asking for i in todo):
                    await self.refresh()
                continue
            await self._run_groups(groups, commands, asking, replies, wait)
            todo, asking = self._redirected(todo, replies)
            if not todo or attempt == MAX_REDIRECTS:
                break
            if any(i not in asking for i in todo):
                await self.refresh()
        return replies

    def _group(
        self, commands: Sequence[Command], todo: list[int], asking: dict[int, str]
    ) -> dict[str, list[int]]:
        groups: dict[str, list[int]] = {}
        owners = self._owners
        for i in todo:
            if i in asking:
                name = asking[i]
            else:
                key = first_key(commands[i])
                if key is None:
                    name = self._any_master()
                else:
                    slot = key_slot(key.encode() if isinstance(key, str) else key)
                    name = owners.get(slot) or self._owner(slot)
            groups.setdefault(name, []).append(i)
        return groups

    def _owner(self, slot: int) -> str:
        """The slot's master from redis-py's map, remembered until the next refresh."""
        name: str = self._client.nodes_manager.get_node_from_slot(slot).name
        self._owners[slot] = name
        return name

    def _any_master(self) -> str:
        name: str = self._client.nodes_manager.get_nodes_by_server_type("primary")[0].name
        return name

    async def _run_groups(
        self,
        groups: dict[str, list[int]],
        commands: Sequence[Command],
        asking: dict[int, str],
        replies: list[Any],
        wait: ReplicaWait | None,
    ) -> None:
        """Queue every group on its master, then collect: no task per group."""
        sent: list[tuple[RedisMux, list[int], Sent]] = []
        try:
            for name, idx in groups.items():
                mux = self._mux(name)
                sent.append(
                    (mux, idx, await mux.send(self._batch(idx, commands, asking), wait=wait))
                )
            for mux, idx, queued in sent:
                self._place(idx, asking, replies, await mux.collect(queued, wait))
        except BaseException as error:
            # One error is raised for the whole call: the other groups' failures (a master
            # down, WAIT unmet) are marked seen so asyncio does not log them as lost.
            for _, _, queued in sent:
                queued.forget()
            if isinstance(error, RedisConnectionError):
                self._refresh_soon()
            raise

    @staticmethod
    def _batch(
        idx: list[int], commands: Sequence[Command], asking: dict[int, str]
    ) -> list[Command]:
        batch: list[Command] = []
        for i in idx:
            if i in asking:
                batch.append(["ASKING"])
            batch.append(commands[i])
        return batch

    @staticmethod
    def _place(idx: list[int], asking: dict[int, str], replies: list[Any], got: list[Any]) -> None:
        pos = 0
        for i in idx:
            if i in asking:
                pos += 1  # ASKING's +OK
            replies[i] = got[pos]
            pos += 1

    async def _run_group(
        self,
        name: str,
        idx: list[int],
        commands: Sequence[Command],
        asking: dict[int, str],
        replies: list[Any],
        wait: ReplicaWait | None,
    ) -> None:
        batch: list[Command] = []
        for i in idx:
            if i in asking:
                batch.append(["ASKING"])
            batch.append(commands[i])
        try:
            got = await self._mux(name).execute(batch, wait=wait)
        except RedisConnectionError:
            self._refresh_soon()
            raise
        pos = 0
        for i in idx:
            if i in asking:
                pos += 1  # ASKING's +OK
            replies[i] = got[pos]
            pos += 1

    @staticmethod
    def _redirected(todo: list[int], replies: list[Any]) -> tuple[list[int], dict[int, str]]:
        again: list[int] = []
        asking: dict[int, str] = {}
        for i in todo:
            reply = replies[i]
            if isinstance(reply, ResponseError):
                text = str(reply)
                if text.startswith("MOVED "):
                    again.append(i)
                elif text.startswith("ASK "):
                    again.append(i)
                    asking[i] = text.split()[2]
                elif text.startswith(("TRYAGAIN", "CLUSTERDOWN")):
                    again.append(i)
        return again, asking

    def _mux(self, name: str) -> RedisMux:
        mux = self._muxes.get(name)
        if mux is None:
            host, _, port = name.rpartition(":")
            kwargs = self._client.nodes_manager.connection_kwargs
            endpoint = Endpoint(
                host=host,
                port=int(port),
                path="",
                db=0,
                username=kwargs.get("username"),
                password=kwargs.get("password"),
                timeout_s=float(kwargs.get("socket_timeout") or 5.0),
                tls=tls_context(kwargs) if speaks_tls(kwargs.get("connection_class")) else None,
            )
            mux = self._muxes[name] = RedisMux(endpoint, decode=self._decode)
        return mux

    async def refresh(self) -> None:
        """Reload the slot map (once for a burst of callers)."""
        async with self._refreshing:
            if time.monotonic() - self._refreshed_at < REFRESH_MIN_INTERVAL_S:
                return
            with contextlib.suppress(Exception):  # a failed refresh: the next call tries again
                await self._client.nodes_manager.initialize()
            self._owners = {}
            self._refreshed_at = time.monotonic()

    def _refresh_soon(self) -> None:
        task = asyncio.create_task(self.refresh(), name="cluster-mux-refresh")
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def aclose(self) -> None:
        """Close every master's connection (the RedisCluster client is its owner's)."""
        for task in list(self._background):
            task.cancel()
        muxes, self._muxes = list(self._muxes.values()), {}
        for mux in muxes:
            await mux.aclose()
