"""The webhook's wire format: the JSON body and its `SpeedInfer-Signature` header (docs/alerts.md).

The scheme is Stripe's: HMAC-SHA256 over `"{t}.{raw body}"`, so a receiver checks the bytes it got and
can refuse a replay whose `t` is too old.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from datetime import datetime
from typing import Any

SIGNATURE_HEADER = "SpeedInfer-Signature"
SECRET_PREFIX = "whsec_"  # noqa: S105 - a prefix, not a secret


def new_signing_secret() -> str:
    return SECRET_PREFIX + secrets.token_hex(24)


def event_body(*, event_id: str, type: str, created: datetime, account: dict[str, Any], data: dict[str, Any]) -> bytes:
    document = {
        "id": event_id,
        "type": type,
        "created": created.isoformat().replace("+00:00", "Z"),
        "account": account,
        "data": data,
    }
    return json.dumps(document, separators=(",", ":"), sort_keys=False).encode()


def signature(*, secret: str, timestamp: int, body: bytes) -> str:
    return hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()


def signature_header(*, secret: str, timestamp: int, body: bytes) -> str:
    return f"t={timestamp},v1={signature(secret=secret, timestamp=timestamp, body=body)}"
