"""Fixtures: a per-test tenant and Redis key prefix (cleaned up afterwards)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from llm_auth.testing import delete_prefix, unique_prefix


@pytest.fixture
def unique_tenant() -> str:
    return f"t-{uuid.uuid4().hex[:12]}"


@pytest_asyncio.fixture
async def prefix(redis_url: str) -> AsyncIterator[str]:
    """A key prefix for this test's auth state; everything under it is deleted afterwards."""
    value = unique_prefix()
    yield value
    await delete_prefix(redis_url, value)
