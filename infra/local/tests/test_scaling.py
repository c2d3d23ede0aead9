"""make scale's parts on their own: the run directory's catalogue copy switched to file
discovery (the catalogue itself untouched), the replica file, the request/answer files."""

from __future__ import annotations

from pathlib import Path

from llm_common.models_config import load_catalog
from llm_stack import catalogue, scaling

CATALOGUE = """
models:
  - name: gen
    checkpoint: gen
    deployments:
      - name: a
        replicas: ["127.0.0.1:50054", "127.0.0.1:50064"]
  - name: enc
    kind: embedding
    checkpoint: enc
    deployments:
      - name: b
        replicas: ["127.0.0.1:50074"]
"""


def test_the_copy_lists_generation_replicas_in_a_file(tmp_path: Path) -> None:
    source = tmp_path / "models.yaml"
    source.write_text(CATALOGUE, encoding="utf-8")
    copy = catalogue.write_copy(source, tmp_path / "run" / "models.yaml", {50054: 41001})
    scalable = scaling.make_scalable(copy, tmp_path / "run")
    assert scalable is not None
    assert (scalable.model, scalable.deployment) == ("gen", "a")
    assert scalable.listing.read_text() == "127.0.0.1:41001\n127.0.0.1:50064\n"
    specs = load_catalog(copy, tmp_path).models
    (gen,) = specs["gen"].deployments
    assert (gen.discovery.kind, gen.discovery.path) == ("file", str(scalable.listing))
    assert specs["enc"].deployments[0].discovery.kind == "static"
    assert copy.read_text().startswith("# Written by llm_stack")
    assert source.read_text() == CATALOGUE  # make up keeps the static addresses


def test_requests_and_answers_pair_up(tmp_path: Path) -> None:
    assert scaling.take_request(tmp_path) is None
    wanted = scaling.request(tmp_path, 3)
    taken = scaling.take_request(tmp_path)
    assert taken == wanted
    assert scaling.take_request(tmp_path) is None  # taken once
    assert scaling.read_result(tmp_path, wanted) is None
    scaling.write_result(tmp_path, wanted, ["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"], "")
    result = scaling.read_result(tmp_path, wanted)
    assert result is not None
    assert result["replicas"] == 3
    assert scaling.read_result(tmp_path, scaling.ScaleRequest(3, "other")) is None
