"""Ids and secrets: 128-bit random ids (BINARY(16) ↔ 32 lowercase hex) and SHA-256 digests."""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets

ID_BYTES = 16
_HEX = frozenset("0123456789abcdef")


def new_id() -> bytes:
    """A fresh 128-bit cryptographically random id, as stored (BINARY(16))."""
    return os.urandom(ID_BYTES)


def id_hex(raw: bytes) -> str:
    """The external form: 32 lowercase hex characters."""
    return raw.hex()


def parse_id(text: str) -> bytes | None:
    """The stored form of an external id, or None when ``text`` is not 32 lowercase hex."""
    if len(text) != 2 * ID_BYTES or not set(text) <= _HEX:
        return None
    return bytes.fromhex(text)


def new_secret(nbytes: int = 32) -> str:
    """A URL-safe random secret (shown once, stored only as :func:`digest`)."""
    return secrets.token_urlsafe(nbytes)


def digest(value: str | bytes) -> bytes:
    """SHA-256 of a secret or of canonical request bytes (BINARY(32))."""
    data = value.encode() if isinstance(value, str) else value
    return hashlib.sha256(data).digest()


def digest_matches(value: str | bytes, stored: bytes) -> bool:
    """Constant-time comparison of ``value``'s digest with a stored digest."""
    return hmac.compare_digest(digest(value), stored)
