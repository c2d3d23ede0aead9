"""Unit-test helpers: catalogues built in code, a manual clock."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from llm_common.models_config import Deployment, ModelCatalog, ModelSpec


class ManualClock:
    """A clock the test advances by hand."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


def model(
    name: str,
    *,
    tier: str = "small",
    kind: str = "generation",
    context: int = 2048,
    aliases: Sequence[str] = (),
    deployments: Sequence[Deployment] = (),
    default_max_tokens: int = 64,
) -> ModelSpec:
    return ModelSpec(
        name=name,
        checkpoint=Path("/nonexistent") / name,
        kind=kind,
        aliases=tuple(aliases),
        context_length=context,
        default_max_tokens=default_max_tokens,
        tier=tier,
        deployments=tuple(deployments) or (Deployment(name=f"{name}-d", replicas=(f"{name}:1",)),),
    )


def catalog(*specs: ModelSpec, tiers: Sequence[str] = ("small", "medium", "large")) -> ModelCatalog:
    aliases = {n: s.name for s in specs for n in (s.name, *s.aliases)}
    return ModelCatalog(models={s.name: s for s in specs}, aliases=aliases, tiers=tuple(tiers))
