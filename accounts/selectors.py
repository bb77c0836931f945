"""Reads for accounts and API keys."""

from __future__ import annotations

from dataclasses import dataclass

from django.db.models import QuerySet
from django.utils import timezone

from accounts import key_cache
from accounts.key_cache import KeyInfo
from accounts.keys import digests_match, key_digest, split_lookup
from accounts.models import Account, ApiKey
from core.db import db_call


@dataclass(frozen=True, slots=True)
class AuthResult:
    key: KeyInfo | None
    reason: str | None  # "missing", "unknown", "revoked" or "expired" when key is None


def _capped(limit: int | None, ceiling: int | None) -> int | None:
    if ceiling is None:
        return limit
    return ceiling if limit is None else min(limit, ceiling)


def _key_info(api_key: ApiKey) -> KeyInfo:
    account = api_key.account
    return KeyInfo(
        id=api_key.pk,
        account_id=api_key.account_id,
        account_name=account.name,
        name=api_key.name,
        prefix=api_key.prefix,
        digest=api_key.digest,
        scopes=frozenset(api_key.scopes),
        allowed_models=frozenset(api_key.allowed_models),
        # A key made before its account's ceiling was set (or lowered) is held to it here.
        rpm=_capped(api_key.rpm, account.rpm_ceiling),
        tpm=_capped(api_key.tpm, account.tpm_ceiling),
        expires_at=api_key.expires_at,
        revoked=api_key.revoked_at is not None,
        monthly_budget=api_key.monthly_budget,
        priority=api_key.priority,
    )


def _check(info: KeyInfo) -> AuthResult:
    if info.revoked:
        return AuthResult(key=None, reason="revoked")
    if info.expires_at is not None and info.expires_at <= timezone.now():
        return AuthResult(key=None, reason="expired")
    return AuthResult(key=info, reason=None)


def api_key_authenticate(*, raw_key: str) -> AuthResult:
    """Authenticate a bearer key: no query on a warm cache, one indexed query otherwise."""
    if not raw_key:
        return AuthResult(key=None, reason="missing")
    lookup = split_lookup(raw_key)
    if lookup is None:
        return AuthResult(key=None, reason="unknown")
    digest = key_digest(raw_key)
    cached = key_cache.get(digest)
    if cached is not None:
        return _check(cached)
    api_key = ApiKey.objects.select_related("account").filter(lookup_id=lookup).first()
    if api_key is None or not digests_match(api_key.digest, digest):
        return AuthResult(key=None, reason="unknown")
    info = _key_info(api_key)
    key_cache.put(info)
    return _check(info)


async def api_key_authenticate_async(*, raw_key: str) -> AuthResult:
    """As api_key_authenticate, without a thread hop when the cache is warm."""
    if raw_key and split_lookup(raw_key) is not None:
        cached = key_cache.get(key_digest(raw_key))
        if cached is not None:
            return _check(cached)
    return await db_call(api_key_authenticate)(raw_key=raw_key)


def account_resolve(*, ref: str) -> Account | None:
    """An account by numeric id or by exact name."""
    ref = ref.strip()
    if ref.isdigit():
        found = Account.objects.filter(pk=int(ref)).first()
        if found is not None:
            return found
    return Account.objects.filter(name=ref).first()


def api_key_resolve(*, ref: str) -> ApiKey | None:
    """A key by its displayed prefix (sk-si-xxxxxxxxxxxx), bare lookup id, or unique name."""
    ref = ref.strip()
    lookup = ref.removeprefix("sk-si-")[:12] if ref.startswith("sk-si-") else ref
    found = ApiKey.objects.filter(lookup_id=lookup).first()
    if found is not None:
        return found
    by_name = list(ApiKey.objects.filter(name=ref)[:2])
    return by_name[0] if len(by_name) == 1 else None


def api_keys_for_account(*, account: Account) -> QuerySet[ApiKey]:
    return ApiKey.objects.filter(account=account).order_by("-created_at")
