"""Admission of a discovered replica: it must be SERVING and report the deployment's model
and weights digest; a mismatch is refused and logged once per replica and reason."""

from __future__ import annotations

from typing import Protocol

from llm_common.logging import get_logger
from llmapi.inference.v1 import inference_service_pb2 as inf_pb

_log = get_logger(__name__)


class Prober(Protocol):
    async def probe(self, replica: str, timeout_s: float) -> inf_pb.InfoResponse | None: ...


class Gate:
    """Decides whether a found replica may take traffic for one deployment of `model`.

    The expected weights digest is the configured one, else the first admitted replica's: a
    replica with other weights (a half-finished rollout, a wrong image) would answer the same
    request differently, and a migrated stream would not continue token-identically.
    """

    def __init__(
        self, prober: Prober, model: str, deployment: str, digest: str, timeout_s: float = 2.0
    ) -> None:
        self._prober = prober
        self._model = model
        self._deployment = deployment
        self.digest = digest
        self._timeout_s = timeout_s
        self._refused: set[tuple[str, str]] = set()  # (replica, reason) already logged

    async def admit(self, replica: str) -> bool:
        """Whether `replica` may serve now (False too while it is not SERVING yet)."""
        info = await self._prober.probe(replica, self._timeout_s)
        if info is None:
            return False
        reason = self._mismatch(info)
        if reason:
            if (replica, reason) not in self._refused:
                self._refused.add((replica, reason))
                _log.warning(
                    "discovered replica refused",
                    replica=replica,
                    deployment=self._deployment,
                    reason=reason,
                )
            return False
        if not self.digest:
            self.digest = info.weights_digest
        return True

    def forget(self, replica: str) -> None:
        """`replica` left: a later one at its address is judged (and logged) afresh."""
        self._refused = {(r, why) for r, why in self._refused if r != replica}

    def _mismatch(self, info: inf_pb.InfoResponse) -> str:
        if info.model != self._model:
            return f"serves model {info.model!r}, not {self._model!r}"
        if self.digest and info.weights_digest != self.digest:
            return f"weights digest {info.weights_digest[:12]} differs from {self.digest[:12]}"
        return ""
