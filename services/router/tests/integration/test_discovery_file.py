"""File discovery (what a local stack's `make scale` drives) through a running router: the
replica file is rewritten while it runs and the router follows without a restart."""

from __future__ import annotations

from pathlib import Path

import pytest

from llm_common.models_config import Deployment, Discovery

from .conftest import Stack, router_settings, running_router, wait_for, with_deployments

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]


async def test_the_router_follows_the_replica_file(stack: Stack, tmp_path: Path) -> None:
    first, second = stack.replica_addrs[:2]
    listing = tmp_path / "replicas.txt"
    listing.write_text(f"# written by the stack\n{first}\n", encoding="utf-8")
    found = Discovery(kind="file", path=str(listing), interval_s=0.1)
    deployment = Deployment(name="local", discovery=found)
    catalog = with_deployments(stack.catalog, deployment)
    async with running_router(router_settings(stack, tmp_path), catalog) as router:
        fleet = router.runtime.discovery.fleet

        async def members(*expected: str) -> bool:
            return set(fleet.replicas(deployment)) == set(expected)

        await wait_for(lambda: members(first))
        listing.write_text(f"{first}\n{second}\n", encoding="utf-8")
        await wait_for(lambda: members(first, second))
        listing.write_text(f"{second}\n", encoding="utf-8")
        await wait_for(lambda: members(second))
        listing.unlink()  # unreadable: the last set stays
        await wait_for(lambda: members(second))
