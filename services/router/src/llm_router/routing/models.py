"""Model routing: names and aliases, the `auto` cascade, deployments by region and weight."""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence

from llm_common.config import ConfigError
from llm_common.errors import FieldViolation, InvalidArgument, NotFound
from llm_common.models_config import Deployment, ModelCatalog, ModelSpec
from llm_router.api.identity import Caller

AUTO_MODEL = "auto"
GENERATION = "generation"
EMBEDDING = "embedding"


class ModelRouter:
    """Resolves requested model names to catalogue entries and orders their deployments.

    `auto` cascade: candidates are the generation models the caller may use, cheapest tier
    first (models.yaml `tiers`), then smaller context, then name. The pipeline takes the first
    candidate whose context holds the prompt plus max_tokens (counted with that model's own
    tokenizer) and that has a replica able to serve; a candidate that does not fit, or whose
    every replica is down, passes the request on to the next tier.

    Deployments: the caller's preferred regions first (in header order), then this router's
    region, then the remaining regions by name. Within a region deployments are ordered by a
    weighted random draw on `weight` (canary rollouts); weight 0 deployments only take over
    when every weighted one of the region is unavailable.
    """

    def __init__(
        self, catalog: ModelCatalog, *, home_region: str, rng: random.Random | None = None
    ) -> None:
        _check_catalog(catalog)
        self._catalog = catalog
        self._home_region = home_region
        self._rng = rng or random.Random()

    @property
    def catalog(self) -> ModelCatalog:
        return self._catalog

    def resolve(self, name: str, kind: str) -> ModelSpec:
        """The model called or aliased `name`; NOT_FOUND if unknown, INVALID_ARGUMENT when it
        is of the other kind (an embedding model asked to chat, or the reverse)."""
        spec = self._catalog.resolve(name)
        if spec is None:
            raise NotFound("model", name)
        if spec.kind != kind:
            use = "Embed" if spec.kind == EMBEDDING else "Chat or Complete"
            raise InvalidArgument(
                [FieldViolation("model", f"{spec.name!r} is a {spec.kind} model; use {use}")]
            )
        return spec

    def auto_candidates(self, caller: Caller, allowed_tiers: frozenset[str]) -> list[ModelSpec]:
        """Generation models for `auto`, in cascade order (see the class docstring)."""
        candidates = [
            spec
            for spec in self._catalog.models.values()
            if spec.kind == GENERATION and spec.deployments and caller.may_use(spec, allowed_tiers)
        ]
        return sorted(candidates, key=self._cascade_key)

    def _cascade_key(self, spec: ModelSpec) -> tuple[int, int, str]:
        return (self._catalog.tier_rank(spec.tier), spec.context_length, spec.name)

    def visible(self, caller: Caller, allowed_tiers: frozenset[str]) -> list[ModelSpec]:
        """Every model the caller may use, by name."""
        specs = self._catalog.models.values()
        return sorted((s for s in specs if caller.may_use(s, allowed_tiers)), key=lambda s: s.name)

    def deployment_order(
        self, spec: ModelSpec, preferred_regions: Sequence[str] = ()
    ) -> list[Deployment]:
        """`spec`'s deployments in the order they should be tried (see the class docstring)."""
        ranks = {region: i for i, region in enumerate(dict.fromkeys(preferred_regions))}
        ranks.setdefault(self._home_region, len(ranks))
        by_region: dict[str, list[Deployment]] = {}
        for deployment in spec.deployments:
            by_region.setdefault(deployment.region, []).append(deployment)
        order = sorted(by_region, key=lambda region: (ranks.get(region, len(ranks)), region))
        return [d for region in order for d in self._weighted_order(by_region[region])]

    def _weighted_order(self, deployments: Sequence[Deployment]) -> list[Deployment]:
        # Efraimidis-Spirakis: sorting by u^(1/w) is a weighted draw without replacement.
        weighted = [d for d in deployments if d.weight > 0]
        keyed = sorted(weighted, key=lambda d: self._rng.random() ** (1.0 / d.weight), reverse=True)
        drained = sorted((d for d in deployments if d.weight <= 0), key=lambda d: d.name)
        return keyed + drained

    def replicas(self) -> list[str]:
        """Every replica address of every deployment, once each."""
        return list(
            dict.fromkeys(
                r for s in self._catalog.models.values() for d in s.deployments for r in d.replicas
            )
        )

    @staticmethod
    def regions(spec: ModelSpec) -> list[str]:
        """Regions with at least one deployment of `spec`."""
        return sorted({d.region for d in spec.deployments})


def _check_catalog(catalog: ModelCatalog) -> None:
    if catalog.resolve(AUTO_MODEL) is not None:
        raise ConfigError(f"MODELS_CONFIG: {AUTO_MODEL!r} is reserved for automatic routing")
    for spec in catalog.models.values():
        _check_deployments(spec.name, spec.deployments)


def _check_deployments(model: str, deployments: Iterable[Deployment]) -> None:
    names: set[str] = set()
    for d in deployments:
        if d.weight < 0:
            raise ConfigError(f"MODELS_CONFIG: model {model}: deployment {d.name} weight < 0")
        if not d.replicas and not d.discovery.dynamic:
            raise ConfigError(f"MODELS_CONFIG: model {model}: deployment {d.name} has no replicas")
        if d.name in names:
            raise ConfigError(f"MODELS_CONFIG: model {model}: deployment {d.name} listed twice")
        names.add(d.name)
