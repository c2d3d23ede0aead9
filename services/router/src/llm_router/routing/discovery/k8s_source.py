"""Kubernetes discovery: the ready endpoints of a Service's EndpointSlices, listed then
watched with the official client (on a thread: the client is synchronous); one replica per
endpoint address at the deployment's port."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterable
from typing import Any

from llm_common.logging import get_logger
from llm_common.models_config import Discovery

_log = get_logger(__name__)
SERVICE_LABEL = "kubernetes.io/service-name"
WATCH_TIMEOUT_S = 30  # server side: the watch is re-opened from the last version after it
READ_TIMEOUT_S = 60.0
RETRY_S = 1.0


def in_cluster_client() -> Any:
    """An ApiClient from the pod's service account (the router's usual place)."""
    from kubernetes import client, config

    config.load_incluster_config()  # type: ignore[no-untyped-call]
    return client.ApiClient()


class EndpointSliceSource:
    """Ready endpoint addresses of Service `discovery.service` in `discovery.namespace`."""

    def __init__(self, discovery: Discovery, api_client: Callable[[], Any]) -> None:
        self._discovery = discovery
        self._api_client = api_client
        self._slices: dict[str, frozenset[str]] = {}  # slice name -> its ready addresses
        self._latest: frozenset[str] | None = None
        self._changed = asyncio.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def next(self, timeout_s: float) -> frozenset[str] | None:
        """The address set when it changed since the last call; None after `timeout_s`."""
        if self._thread is None:
            self._loop = asyncio.get_running_loop()
            self._thread = threading.Thread(target=self._run, name="endpointslices", daemon=True)
            self._thread.start()
        try:
            await asyncio.wait_for(self._changed.wait(), timeout_s)
        except TimeoutError:
            return None
        self._changed.clear()
        return self._latest

    def close(self) -> None:
        self._stopping.set()

    def _run(self) -> None:
        from kubernetes import client, watch

        api = client.DiscoveryV1Api(self._api_client())
        selector = f"{SERVICE_LABEL}={self._discovery.service}"
        namespace = self._discovery.namespace
        while not self._stopping.is_set():
            try:
                listed: Any = api.list_namespaced_endpoint_slice(namespace, label_selector=selector)
                self._slices = {s.metadata.name: self._ready(s) for s in listed.items}
                self._publish()
                version = listed.metadata.resource_version
                stream = watch.Watch().stream(  # type: ignore[no-untyped-call]
                    api.list_namespaced_endpoint_slice, namespace, label_selector=selector,
                    resource_version=version, timeout_seconds=WATCH_TIMEOUT_S,
                    _request_timeout=READ_TIMEOUT_S,
                )  # fmt: skip
                for event in stream:
                    if self._stopping.is_set():
                        return
                    self._apply(event["type"], event["object"])
            except Exception as err:  # the client raises ApiException, urllib3 and socket errors
                _log.warning("endpointslice watch failed", service=selector, error=repr(err))
                self._stopping.wait(RETRY_S)

    def _apply(self, kind: str, endpoint_slice: Any) -> None:
        name = endpoint_slice.metadata.name
        if kind == "DELETED":
            self._slices.pop(name, None)
        elif kind in ("ADDED", "MODIFIED"):
            self._slices[name] = self._ready(endpoint_slice)
        else:
            return  # BOOKMARK, ERROR: nothing about endpoints
        self._publish()

    def _ready(self, endpoint_slice: Any) -> frozenset[str]:
        port = self._discovery.port
        return frozenset(
            f"[{a}]:{port}" if ":" in a else f"{a}:{port}"
            for a in _ready_addresses(endpoint_slice.endpoints or ())
        )

    def _publish(self) -> None:
        addresses = frozenset().union(*self._slices.values())
        loop = self._loop
        if loop is not None:
            loop.call_soon_threadsafe(self._deliver, addresses)

    def _deliver(self, addresses: frozenset[str]) -> None:
        if addresses != self._latest:
            self._latest = addresses
            self._changed.set()


def _ready_addresses(endpoints: Iterable[Any]) -> list[str]:
    """Addresses of endpoints that are ready; an unset `ready` counts as ready (the API's
    rule), `terminating` ones are not (a draining pod takes no new work)."""
    found: list[str] = []
    for endpoint in endpoints:
        conditions = endpoint.conditions
        if conditions is not None and conditions.ready is False:
            continue
        if conditions is not None and conditions.terminating:
            continue
        found.extend(endpoint.addresses or ())
    return found
