"""Which stored fields are sealed, and how the store opens them again.

Sealed: the response (`r`), the embedding (`v`: vectors can be inverted to much of their
text) and the prompt text the semantic index needs (`s`). Not sealed: the creation time and
digests (entry ids, namespaces, blocked query digests), which carry no text.
"""

from __future__ import annotations

from collections.abc import Sequence

from llm_cache.datakeys import DataKeys
from llm_cache.envelope import SealError, dek_id_of
from llm_common.logging import get_logger

SEALED_FIELDS = frozenset({"r", "v", "s"})
_log = get_logger(__name__)


class EntrySealer:
    """Seals an entry's fields with its tenant's active data key; opens them by the key id
    each envelope names (so values sealed before a rotation still open)."""

    def __init__(self, keys: DataKeys) -> None:
        self.keys = keys

    async def seal_fields(
        self, tag: str, entry_id: str, fields: Sequence[bytes | str]
    ) -> list[bytes | str]:
        """`fields` (flattened name/value pairs) with the sealed fields' values encrypted."""
        key = await self.keys.active(tag)
        sealed: list[bytes | str] = []
        for name, value in zip(fields[::2], fields[1::2], strict=True):
            label = name.decode() if isinstance(name, bytes) else name
            if label in SEALED_FIELDS:
                raw = value.encode() if isinstance(value, str) else value
                value = key.seal(entry_id, label, raw)
            sealed += [name, value]
        return sealed

    async def open(self, tag: str, entry_id: str, field: str, sealed: bytes) -> bytes | None:
        """The plaintext, or None when it does not open (its key was shredded, a value from
        before encryption was turned on, or tampered with): the caller treats it as absent."""
        try:
            key = await self.keys.get(tag, dek_id_of(sealed))
            if key is None:
                return None
            return key.open(entry_id, field, sealed)
        except SealError as exc:
            _log.warning("stored value does not open", tag=tag, field=field, error=str(exc))
            return None
