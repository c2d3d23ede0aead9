"""Model routing: aliases, kinds, the `auto` cascade order, canary weights, regions."""

from __future__ import annotations

import random
from collections import Counter

import grpc
import pytest

from llm_common.config import ConfigError
from llm_common.errors import InvalidArgument, NotFound
from llm_common.models_config import Deployment
from llm_router.api.identity import Caller
from llm_router.routing.models import ModelRouter

from .conftest import catalog, model

ANYONE = Caller("t", "k", frozenset())


def test_names_and_aliases_resolve_to_the_canonical_model() -> None:
    router = ModelRouter(catalog(model("llama", aliases=["fast"])), home_region="local")
    assert router.resolve("llama", "generation").name == "llama"
    assert router.resolve("fast", "generation").name == "llama"


def test_unknown_model_is_not_found() -> None:
    router = ModelRouter(catalog(model("llama")), home_region="local")
    with pytest.raises(NotFound) as exc:
        router.resolve("gpt-9", "generation")
    assert exc.value.code == grpc.StatusCode.NOT_FOUND
    assert exc.value.resource_name == "gpt-9"


def test_kind_mismatch_is_invalid_argument() -> None:
    router = ModelRouter(
        catalog(model("llama"), model("minilm", kind="embedding")), home_region="local"
    )
    with pytest.raises(InvalidArgument) as exc:
        router.resolve("minilm", "generation")
    assert exc.value.violations[0].field == "model"
    with pytest.raises(InvalidArgument):
        router.resolve("llama", "embedding")


def test_auto_cascade_orders_by_tier_then_context_then_name() -> None:
    specs = [
        model("big", tier="large", context=8192),
        model("mid", tier="medium", context=4096),
        model("small-long", tier="small", context=4096),
        model("small-short", tier="small", context=1024),
        model("odd", tier="unlisted", context=512),
        model("emb", kind="embedding"),
    ]
    router = ModelRouter(catalog(*specs), home_region="local")
    order = [s.name for s in router.auto_candidates(ANYONE, frozenset())]
    assert order == ["small-short", "small-long", "mid", "big", "odd"]


def test_auto_respects_model_and_tier_permissions() -> None:
    specs = [model("a", tier="small"), model("b", tier="medium"), model("c", tier="large")]
    router = ModelRouter(catalog(*specs), home_region="local")
    tier_scoped = Caller("t", "k", frozenset({"tier:medium", "tier:large"}))
    assert [s.name for s in router.auto_candidates(tier_scoped, frozenset())] == ["b", "c"]
    model_scoped = Caller("t", "k", frozenset({"model:c"}))
    assert [s.name for s in router.auto_candidates(model_scoped, frozenset())] == ["c"]
    tenant_tiers = frozenset({"small"})
    assert [s.name for s in router.auto_candidates(ANYONE, tenant_tiers)] == ["a"]
    assert [s.name for s in router.visible(ANYONE, tenant_tiers)] == ["a"]


def test_canary_weights_split_traffic() -> None:
    stable = Deployment(name="stable", weight=90, replicas=("s:1",))
    canary = Deployment(name="canary", weight=10, replicas=("c:1",))
    spec = model("llama", deployments=[stable, canary])
    router = ModelRouter(catalog(spec), home_region="local", rng=random.Random(7))
    first = Counter(router.deployment_order(spec)[0].name for _ in range(4000))
    assert 0.86 < first["stable"] / 4000 < 0.94
    assert first["canary"] > 0


def test_weight_zero_is_only_a_fallback() -> None:
    live = Deployment(name="live", weight=1, replicas=("l:1",))
    drained = Deployment(name="drained", weight=0, replicas=("d:1",))
    spec = model("llama", deployments=[drained, live])
    router = ModelRouter(catalog(spec), home_region="local", rng=random.Random(1))
    for _ in range(50):
        assert [d.name for d in router.deployment_order(spec)] == ["live", "drained"]


def test_region_preference_with_fallback() -> None:
    deployments = [
        Deployment(name="eu", region="eu-west", replicas=("e:1",)),
        Deployment(name="us", region="us-east", replicas=("u:1",)),
        Deployment(name="home", region="local", replicas=("h:1",)),
        Deployment(name="ap", region="ap-south", replicas=("a:1",)),
    ]
    spec = model("llama", deployments=deployments)
    router = ModelRouter(catalog(spec), home_region="local")
    names = [d.name for d in router.deployment_order(spec, ["us-east", "eu-west"])]
    assert names == ["us", "eu", "home", "ap"]
    # Without a preference the router's own region comes first, then the rest by name.
    assert [d.name for d in router.deployment_order(spec)] == ["home", "ap", "eu", "us"]
    # An unknown preferred region is skipped, not an error.
    assert router.deployment_order(spec, ["mars"])[0].name == "home"
    assert ModelRouter.regions(spec) == ["ap-south", "eu-west", "local", "us-east"]


def test_replicas_lists_every_address_once() -> None:
    shared = Deployment(name="d2", replicas=("x:1", "y:1"))
    router = ModelRouter(
        catalog(
            model("a", deployments=[Deployment(name="d1", replicas=("x:1",))]),
            model("b", deployments=[shared]),
        ),
        home_region="local",
    )
    assert router.replicas() == ["x:1", "y:1"]


@pytest.mark.parametrize(
    "spec",
    [
        model("auto"),
        model("x", aliases=["auto"]),
        model("x", deployments=[Deployment(name="d", weight=-1, replicas=("r:1",))]),
        model("x", deployments=[Deployment(name="d", replicas=())]),
        model(
            "x",
            deployments=[
                Deployment(name="d", replicas=("r:1",)),
                Deployment(name="d", replicas=("r:2",)),
            ],
        ),
    ],
)
def test_bad_catalogues_fail_start_up(spec: object) -> None:
    with pytest.raises(ConfigError):
        ModelRouter(catalog(spec), home_region="local")  # type: ignore[arg-type]
