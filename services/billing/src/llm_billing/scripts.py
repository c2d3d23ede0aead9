"""The ledger's Lua scripts (lua/*.lua, each prefixed with lua/common.lua), registered once."""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources

import redis.asyncio
from redis.commands.core import AsyncScript

SCRIPT_NAMES = ("reserve", "settle", "release", "expire", "forget")


def script_source(name: str) -> str:
    """The full source of one script: the shared helpers, then the script itself."""
    folder = resources.files("llm_billing") / "lua"
    common = (folder / "common.lua").read_text(encoding="utf-8")
    return common + "\n" + (folder / f"{name}.lua").read_text(encoding="utf-8")


@dataclass(frozen=True, slots=True)
class Scripts:
    """EVALSHA-backed callables (redis-py reloads a script after NOSCRIPT, e.g. a restart)."""

    reserve: AsyncScript
    settle: AsyncScript
    release: AsyncScript
    expire: AsyncScript
    forget: AsyncScript

    @classmethod
    def register(cls, client: redis.asyncio.Redis) -> Scripts:
        scripts = {name: client.register_script(script_source(name)) for name in SCRIPT_NAMES}
        return cls(**scripts)

    async def load(self, client: redis.asyncio.Redis) -> None:
        """SCRIPT LOAD every script (after NOSCRIPT in a pipeline, e.g. a Redis restart)."""
        for script in (self.reserve, self.settle, self.release, self.expire, self.forget):
            script.sha = await client.script_load(script.script)
