"""`python -m llm_stack redis-secrets`: the Kubernetes secrets of the Redis ACL users, with
fresh passwords, as YAML for `kubectl apply -f -`.

- `redis-acl` (`users.acl`): the ACL file the dev overlay's Redis loads (hashes only); for an
  external Redis or Redis Cluster, load the same file on every node;
- `redis-<service>` (`username`, `password`): what auth, cache and billing read as
  REDIS_USERNAME / REDIS_PASSWORD (infra/k8s/base).

Each run makes new passwords: apply all of them together, then restart Redis (or ACL LOAD) and
the three services. Nothing is written to disk.
"""

from __future__ import annotations

import base64
from typing import Any

import yaml

from llm_common.redis_acl import SERVICE_ACLS, RedisUser, acl_file, new_password

ACL_SECRET = "redis-acl"
ACL_KEY = "users.acl"


def secret_name(service: str) -> str:
    return f"redis-{service}"


def _secret(name: str, namespace: str, data: dict[str, str]) -> dict[str, Any]:
    encoded = {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"app.kubernetes.io/part-of": "llm-platform"},
        },
        "type": "Opaque",
        "data": encoded,
    }


def redis_secrets(namespace: str = "llm", prefix: str = "") -> list[dict[str, Any]]:
    """The ACL secret and one credentials secret per service, new passwords each call;
    `prefix` goes before each service's default key prefix (as LLM_REDIS_PREFIX does)."""
    users = {
        name: RedisUser(name, new_password(), f"{prefix}{acl.default_prefix}")
        for name, acl in SERVICE_ACLS.items()
    }
    manifests = [_secret(ACL_SECRET, namespace, {ACL_KEY: acl_file(users)})]
    for name, user in users.items():
        credentials = {"username": user.name, "password": user.password}
        manifests.append(_secret(secret_name(name), namespace, credentials))
    return manifests


def render(manifests: list[dict[str, Any]]) -> str:
    return yaml.safe_dump_all(manifests, sort_keys=False)
