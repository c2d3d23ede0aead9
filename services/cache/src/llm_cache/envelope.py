"""Encryption at rest: AES-GCM envelopes for stored values, and the master keys that wrap
each tenant's data keys (docs/adr/0017).

A stored value is `version (1) | data key id (8) | nonce (12) | ciphertext + tag (16)`. Its
associated data names the tenant (its tag), the entry and the field, so a ciphertext moved to
another tenant, entry or field does not decrypt. Data keys (DEKs) are random per tenant and are
stored only wrapped by a master key (KEK) from a MasterKeyProvider.
"""

from __future__ import annotations

import base64
import os
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

VERSION = 0xE1  # not a valid first byte of a protobuf message (wire type 1 of field 28 unused)
DEK_ID_BYTES = 8
NONCE_BYTES = 12
KEY_BYTES = 32
HEADER_BYTES = 1 + DEK_ID_BYTES + NONCE_BYTES
OVERHEAD_BYTES = HEADER_BYTES + 16  # plus the GCM tag
_KEY_ID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-_.")


class SealError(Exception):
    """A value or wrapped key that does not open: unknown key, wrong context, tampered."""


@dataclass(frozen=True, slots=True)
class WrappedKey:
    """A data key wrapped by the master key `kek_id`."""

    kek_id: str
    blob: bytes  # nonce | ciphertext + tag

    def encode(self) -> bytes:
        return self.kek_id.encode() + b":" + self.blob

    @classmethod
    def decode(cls, stored: bytes | str) -> WrappedKey:
        raw = stored.encode() if isinstance(stored, str) else stored
        kek_id, sep, blob = raw.partition(b":")
        if not sep or not kek_id:
            raise SealError("malformed wrapped key")
        return cls(kek_id.decode(errors="replace"), blob)


class MasterKeyProvider(Protocol):
    """A KMS-style key encryption service: wraps and unwraps data keys under a context (the
    associated data), never handing out the master key. A remote KMS fits behind the same two
    calls; both may be slow, so callers cache unwrapped keys."""

    @property
    def active_id(self) -> str:
        """The master key new wraps use."""
        ...

    def key_ids(self) -> tuple[str, ...]:
        """Every master key that still unwraps (the active one first)."""
        ...

    async def wrap(self, dek: bytes, context: bytes) -> WrappedKey: ...

    async def unwrap(self, wrapped: WrappedKey, context: bytes) -> bytes: ...


class KeyRing:
    """Master keys by id, the first active: the others only unwrap (rotation without downtime:
    add the new key to every replica first, then make it active, rewrap, retire the old)."""

    def __init__(self, keys: list[tuple[str, bytes]]) -> None:
        if not keys:
            raise ValueError("no master key")
        for key_id, key in keys:
            if not key_id or not set(key_id) <= _KEY_ID_CHARS or len(key) != KEY_BYTES:
                raise ValueError(f"master key {key_id!r}: ids are [a-z0-9._-], keys 32 bytes")
        self._order = tuple(key_id for key_id, _ in keys)
        if len(set(self._order)) != len(self._order):
            raise ValueError("duplicate master key id")
        self._keys = {key_id: AESGCM(key) for key_id, key in keys}

    @property
    def active_id(self) -> str:
        return self._order[0]

    def key_ids(self) -> tuple[str, ...]:
        return self._order

    async def wrap(self, dek: bytes, context: bytes) -> WrappedKey:
        nonce = os.urandom(NONCE_BYTES)
        sealed = self._keys[self.active_id].encrypt(nonce, dek, context)
        return WrappedKey(self.active_id, nonce + sealed)

    async def unwrap(self, wrapped: WrappedKey, context: bytes) -> bytes:
        kek = self._keys.get(wrapped.kek_id)
        if kek is None:
            raise SealError(f"unknown master key {wrapped.kek_id!r}")
        try:
            return kek.decrypt(wrapped.blob[:NONCE_BYTES], wrapped.blob[NONCE_BYTES:], context)
        except (InvalidTag, ValueError) as exc:
            raise SealError("wrapped key does not open") from exc


def read_key_file(path: Path) -> KeyRing:
    """A key ring from a file of `<id>:<base64 of 32 bytes>` lines, the active key first
    (blank lines and `#` comments skipped). The file must not be readable by others."""
    mode = path.stat().st_mode
    if mode & (stat.S_IRWXG | stat.S_IRWXO) and not _is_mounted_secret(path):
        raise ValueError(f"{path} is readable by others (chmod 600)")
    keys = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        key_id, sep, encoded = text.partition(":")
        try:
            key = base64.b64decode(encoded, validate=True)
        except ValueError:
            key = b""
        if not sep or len(key) != KEY_BYTES:
            raise ValueError(f"{path} line {number}: expected <id>:<base64 of 32 bytes>")
        keys.append((key_id.strip(), key))
    return KeyRing(keys)


def _is_mounted_secret(path: Path) -> bool:
    # Kubernetes mounts Secret files as symlinks into `..data/`, group-readable under
    # fsGroup; the pod's own user is the only other reader there.
    return path.is_symlink() and "..data" in os.readlink(path)


def new_key_line(key_id: str) -> str:
    """A fresh `<id>:<base64>` line for a key file."""
    return f"{key_id}:{base64.b64encode(secrets.token_bytes(KEY_BYTES)).decode()}"


def write_new_key_file(path: Path, key_id: str = "k1") -> bool:
    """Create a key file with one fresh key (mode 600) unless one exists; True if created."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as out:
        out.write("# cache master keys: <id>:<base64 32 bytes>, the active key first\n")
        out.write(new_key_line(key_id) + "\n")
    return True


@dataclass(frozen=True, slots=True)
class DataKey:
    """An unwrapped data key of one tenant, ready to seal and open its values."""

    tag: str
    dek_id: bytes
    aead: AESGCM

    def seal(self, entry_id: str, field: str, plaintext: bytes) -> bytes:
        nonce = os.urandom(NONCE_BYTES)
        aad = associated_data(self.tag, entry_id, field)
        return bytes((VERSION,)) + self.dek_id + nonce + self.aead.encrypt(nonce, plaintext, aad)

    def open(self, entry_id: str, field: str, sealed: bytes) -> bytes:
        aad = associated_data(self.tag, entry_id, field)
        try:
            nonce = sealed[1 + DEK_ID_BYTES : HEADER_BYTES]
            return self.aead.decrypt(nonce, sealed[HEADER_BYTES:], aad)
        except (InvalidTag, ValueError) as exc:
            raise SealError("value does not open") from exc


def dek_id_of(sealed: bytes) -> bytes:
    """The data key id in an envelope; SealError when it is not one."""
    if len(sealed) < OVERHEAD_BYTES or sealed[0] != VERSION:
        raise SealError("not an envelope")
    return sealed[1 : 1 + DEK_ID_BYTES]


def associated_data(tag: str, entry_id: str, field: str) -> bytes:
    return f"llmcache/v1\x00{tag}\x00{entry_id}\x00{field}".encode()


def dek_context(tag: str, dek_id: bytes) -> bytes:
    """What a wrapped data key is bound to: its tenant and its id."""
    return f"llmcache/dek/v1\x00{tag}\x00{dek_id.hex()}".encode()


def new_data_key(tag: str) -> tuple[DataKey, bytes]:
    """A fresh random data key and its raw bytes (to be wrapped)."""
    raw = AESGCM.generate_key(bit_length=256)
    return DataKey(tag, secrets.token_bytes(DEK_ID_BYTES), AESGCM(raw)), raw
