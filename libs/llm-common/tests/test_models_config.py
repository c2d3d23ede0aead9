"""The models catalogue: parsing, alias resolution, tiers and every rejected shape."""

from __future__ import annotations

from pathlib import Path

import pytest

from llm_common.config import ConfigError
from llm_common.models_config import load_catalog

REPO_CATALOGUE = Path(__file__).resolve().parents[3] / "infra" / "config" / "models.yaml"

GOOD = """
tiers: [small, large]
models:
  - name: big
    aliases: [b]
    checkpoint: /abs/big
    context_length: 8192
    default_max_tokens: 512
    tier: large
    tool_parser: llama3_json
    deployments:
      - {name: big-eu, region: eu, weight: 10, replicas: ["10.0.0.1:1"]}
      - {name: big-us, backend: tensorrt_llm, region: us, replicas: ["10.0.0.2:1", "10.0.0.3:1"]}
  - name: enc
    kind: embedding
    checkpoint: enc
    context_length: 256
"""


def catalogue(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "models.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_parses_models_deployments_and_tiers(tmp_path: Path) -> None:
    catalog = load_catalog(catalogue(tmp_path, GOOD), tmp_path / "root")
    big = catalog.resolve("b")
    assert big is not None
    assert big.name == "big"
    assert big.checkpoint == Path("/abs/big")
    assert [d.region for d in big.deployments] == ["eu", "us"]
    assert big.deployments[1].backend == "tensorrt_llm"
    assert big.deployments[1].replicas == ("10.0.0.2:1", "10.0.0.3:1")
    assert big.tool_parser == "llama3_json"
    enc = catalog.resolve("enc")
    assert enc is not None
    assert enc.kind == "embedding"
    assert enc.checkpoint == tmp_path / "root" / "enc"  # relative to MODEL_ROOT
    assert enc.tool_parser == "hermes"  # the default
    assert catalog.resolve("nope") is None
    assert catalog.names() == ["big", "enc"]
    assert (catalog.tier_rank("small"), catalog.tier_rank("large")) == (0, 1)
    assert catalog.tier_rank("unlisted") == 2


def test_the_repository_catalogue_loads(tmp_path: Path) -> None:
    catalog = load_catalog(REPO_CATALOGUE, tmp_path)
    demo = catalog.resolve("demo")
    assert demo is not None
    assert demo.kind == "generation"
    assert demo.default_max_tokens < demo.context_length
    assert demo.tool_parser == "hermes"
    minilm = catalog.resolve("minilm")
    assert minilm is not None
    assert minilm.kind == "embedding"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("models: []", "no `models` list"),
        ("models:\n  - name: a\n", "needs `name` and `checkpoint`"),
        ("models:\n  - {name: a, checkpoint: a, kind: audio}", "kind must be one of"),
        ("models:\n  - {name: a, checkpoint: a, context_length: 0}", "context_length must be"),
        ("models:\n  - {name: a, checkpoint: a, context_length: true}", "context_length must be"),
        (
            "models:\n  - {name: a, checkpoint: a, context_length: 100, default_max_tokens: 100}",
            "default_max_tokens >= context_length",
        ),
        (
            "models:\n  - {name: a, checkpoint: a, aliases: [b]}\n  - {name: b, checkpoint: b}",
            "twice",
        ),
        ("models:\n  - {name: a, checkpoint: a, deployments: [{region: eu}]}", "needs a `name`"),
        ("tiers: small\nmodels:\n  - {name: a, checkpoint: a}", "`tiers` must be a list"),
        ("tiers: [s, s]\nmodels:\n  - {name: a, checkpoint: a}", "lists a tier twice"),
        ("models: [unclosed", "cannot read"),
        (
            "models:\n  - {name: a, checkpoint: a, tool_parser: mistral}",
            "model a: tool_parser 'mistral' must be one of ('hermes', 'llama3_json')",
        ),
    ],
)
def test_rejects_bad_catalogues(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match="MODELS_CONFIG") as err:
        load_catalog(catalogue(tmp_path, text), tmp_path)
    assert message in str(err.value)


def test_missing_file_names_the_variable(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="MODELS_CONFIG: cannot read"):
        load_catalog(tmp_path / "absent.yaml", tmp_path)
