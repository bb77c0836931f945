"""Reads behind GET /v1/key and GET /v1/usage."""

from __future__ import annotations

from typing import Any

from accounts.key_cache import KeyInfo
from accounts.models import SCOPES, Account
from billing.selectors import key_budget_document, usage_for_account
from core.credits import format_credits


def key_summary(*, key: KeyInfo) -> dict[str, Any]:
    """The GET /v1/key body (docs/interface.md, HTTP): the key as configured and its account's balances (one query)."""
    available, reserved = Account.objects.filter(pk=key.account_id).values_list("available", "reserved").get()
    return {
        "data": {
            "name": key.name,
            "prefix": key.prefix,
            "account": key.account_name,
            "scopes": [s for s in SCOPES if s in key.scopes],
            "models": sorted(key.allowed_models),  # empty: every enabled model
            "rate_limit": {"rpm": key.rpm, "tpm": key.tpm},
            "balance": format_credits(available),
            "reserved": format_credits(reserved),
            "budget": key_budget_document(api_key_id=key.id, monthly_budget=key.monthly_budget),
            "expires_at": key.expires_at.isoformat() if key.expires_at else None,
            "priority": key.priority,
        }
    }


def usage_page(*, key: KeyInfo, limit: int, after: int | None) -> dict[str, Any]:
    """The key's account's usage records, newest first; `after` is the last id of the previous page."""
    records = usage_for_account(account_id=key.account_id).order_by("-id")
    if after is not None:
        records = records.filter(id__lt=after)
    rows = list(records[: limit + 1])
    data = [
        {
            "id": r.pk,
            "object": "usage.record",
            "created_at": r.created_at.isoformat(),
            "request_id": r.request_id,
            "endpoint": r.endpoint,
            "model": r.model_id,
            "prompt_tokens": r.prompt_tokens,
            "completion_tokens": r.completion_tokens,
            "total_tokens": r.prompt_tokens + r.completion_tokens,
            "cached_tokens": r.cached_tokens,
            "reasoning_tokens": r.reasoning_tokens,
            "cost": format_credits(r.cost),
            "reserved": format_credits(r.reserved),
            "status": r.status,
            "error_code": r.error_code or None,
            "latency_ms": r.latency_ms,
            "ttft_ms": r.ttft_ms,
            "queue_wait_ms": r.queue_wait_ms,
            "streamed": r.streamed,
        }
        for r in rows[:limit]
    ]
    return {
        "object": "list",
        "data": data,
        "has_more": len(rows) > limit,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
    }
