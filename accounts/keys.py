"""API key format and hashing.

A key reads `sk-si-<lookup><secret>`: the 12-character lookup id finds the row
by a unique index, and only HMAC-SHA256(SECRET_KEY, key) is stored, compared
with hmac.compare_digest.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import string

from django.conf import settings

KEY_PREFIX = "sk-si-"
LOOKUP_LENGTH = 12
_LOOKUP_ALPHABET = string.ascii_lowercase + string.digits


def generate_key() -> tuple[str, str]:
    """Return (lookup_id, full secret key)."""
    lookup = "".join(secrets.choice(_LOOKUP_ALPHABET) for _ in range(LOOKUP_LENGTH))
    return lookup, f"{KEY_PREFIX}{lookup}{secrets.token_urlsafe(32)}"


def key_digest(raw_key: str) -> str:
    return hmac.new(settings.SECRET_KEY.encode(), raw_key.encode(), hashlib.sha256).hexdigest()


def split_lookup(raw_key: str) -> str | None:
    """The lookup id of a well-formed key, else None."""
    if not raw_key.startswith(KEY_PREFIX) or len(raw_key) < len(KEY_PREFIX) + LOOKUP_LENGTH + 16:
        return None
    lookup = raw_key[len(KEY_PREFIX) : len(KEY_PREFIX) + LOOKUP_LENGTH]
    if any(ch not in _LOOKUP_ALPHABET for ch in lookup):
        return None
    return lookup


def digests_match(stored: str, computed: str) -> bool:
    return hmac.compare_digest(stored.encode(), computed.encode())
