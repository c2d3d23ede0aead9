"""Redis ACL users in Kubernetes (docs/security.md threat 7): each Redis-using service reads
its own `redis-<service>` secret, the dev Redis loads the `redis-acl` secret, prod's external
cluster keeps per-service users, and `python -m llm_stack redis-secrets` generates matching,
schema-valid secrets."""

from __future__ import annotations

import base64
import hashlib
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml

from llm_common.redis_acl import SERVICE_ACLS
from llm_stack.k8s_secrets import ACL_KEY, ACL_SECRET, redis_secrets, render, secret_name

REPO = Path(__file__).resolve().parents[3]
K8S = REPO / "infra" / "k8s"
KUBERNETES_VERSION = "1.32.0"
Manifest = dict[str, Any]


def kustomize(overlay: str) -> list[Manifest]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed")
    done = subprocess.run(
        [kubectl, "kustomize", str(K8S / "overlays" / overlay)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def workload(built: list[Manifest], name: str) -> Manifest:
    return next(
        m
        for m in built
        if m["kind"] in ("Deployment", "StatefulSet") and m["metadata"]["name"] == name
    )


def secret_refs(manifest: Manifest) -> dict[str, tuple[str, str]]:
    (app,) = manifest["spec"]["template"]["spec"]["containers"]
    refs = {}
    for entry in app["env"]:
        ref = entry.get("valueFrom", {}).get("secretKeyRef")
        if ref is not None:
            refs[entry["name"]] = (ref["name"], ref["key"])
    return refs


@pytest.mark.parametrize("overlay", ["dev", "prod"])
@pytest.mark.parametrize("service", list(SERVICE_ACLS))
def test_each_service_reads_its_own_redis_user(overlay: str, service: str) -> None:
    refs = secret_refs(workload(kustomize(overlay), service))
    assert refs["REDIS_USERNAME"] == (secret_name(service), "username")
    assert refs["REDIS_PASSWORD"] == (secret_name(service), "password")


def test_services_without_redis_get_no_redis_credentials() -> None:
    built = kustomize("dev")
    for name in ("router", "tokenizer", "inference"):
        assert not any(k.startswith("REDIS") for k in secret_refs(workload(built, name)))


def test_the_dev_redis_loads_the_acl_secret() -> None:
    redis = workload(kustomize("dev"), "redis")
    spec = redis["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    args = container["args"]
    acl_path = Path(args[args.index("--aclfile") + 1])
    volumes = {v["name"]: v for v in spec["volumes"]}
    mount = next(m for m in container["volumeMounts"] if Path(m["mountPath"]) == acl_path.parent)
    assert mount["readOnly"] is True
    assert volumes[mount["name"]]["secret"]["secretName"] == ACL_SECRET
    assert acl_path.name == ACL_KEY


def test_generated_secrets_are_valid_and_match_the_acl_file() -> None:
    manifests = list(yaml.safe_load_all(render(redis_secrets("llm"))))
    for manifest in manifests:
        kubernetes_validate.validate(manifest, KUBERNETES_VERSION, strict=True)
    by_name = {m["metadata"]["name"]: decoded(m) for m in manifests}
    acl = by_name[ACL_SECRET][ACL_KEY]
    assert acl.splitlines()[0].startswith("user default off")
    for service, rules in SERVICE_ACLS.items():
        credentials = by_name[secret_name(service)]
        assert credentials["username"] == service
        digest = hashlib.sha256(credentials["password"].encode()).hexdigest()
        line = next(x for x in acl.splitlines() if x.startswith(f"user {service} "))
        assert f" on #{digest} " in line
        assert f"~{rules.default_prefix}* " in line
        assert credentials["password"] not in acl
    again = {m["metadata"]["name"]: decoded(m) for m in redis_secrets("llm")}
    assert again[secret_name("auth")]["password"] != by_name[secret_name("auth")]["password"]


def decoded(secret: Manifest) -> dict[str, str]:
    return {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}


def test_the_documented_command_is_the_one_the_cli_offers() -> None:
    text = (K8S / "overlays" / "dev" / "redis.yaml").read_text()
    assert re.search(r"python -m llm_stack redis-secrets \| kubectl -n llm apply -f -", text)
