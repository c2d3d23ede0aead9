"""The replicas each deployment has right now: the listed ones for static discovery, the
admitted ones (found, probed, same model and weights) for dns and kubernetes discovery."""

from __future__ import annotations

from llm_common.models_config import Deployment


class Fleet:
    """Replica addresses per deployment; the dispatcher reads it for every placement."""

    def __init__(self) -> None:
        self._admitted: dict[Deployment, tuple[str, ...]] = {}

    def replicas(self, deployment: Deployment) -> tuple[str, ...]:
        if not deployment.discovery.dynamic:
            return deployment.replicas
        return self._admitted.get(deployment, ())

    def admit(self, deployment: Deployment, replica: str) -> None:
        current = self._admitted.get(deployment, ())
        if replica not in current:
            self._admitted[deployment] = (*current, replica)

    def remove(self, deployment: Deployment, replica: str) -> None:
        """No new requests go to `replica`; the ones it runs finish or migrate."""
        current = self._admitted.get(deployment, ())
        self._admitted[deployment] = tuple(r for r in current if r != replica)
