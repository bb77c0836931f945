"""Reads for accounts and API keys."""

from __future__ import annotations

from dataclasses import dataclass

from django.db.models import QuerySet
from django.utils import timezone

from accounts import key_cache
from accounts.key_cache import KeyInfo
from accounts.keys import digests_match, key_digest, split_lookup
from accounts.models import Account, ApiKey, Invitation, Membership
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


def membership_for_user(*, user: object) -> Membership | None:
    """The signed-in user's membership (account and role), read on every dashboard request so
    that a removed member or a changed role takes effect on their very next request."""
    user_id = getattr(user, "pk", None)
    if not getattr(user, "is_authenticated", False) or user_id is None:
        return None
    return Membership.objects.select_related("account", "user").filter(user_id=user_id).first()


def members_of_account(*, account: Account) -> QuerySet[Membership]:
    return Membership.objects.filter(account=account).select_related("user").order_by("created_at", "pk")


def membership_in_account(*, account: Account, membership_id: int) -> Membership | None:
    return Membership.objects.select_related("user", "account").filter(account=account, pk=membership_id).first()


def membership_by_email(*, account: Account, email: str) -> Membership | None:
    return (
        Membership.objects.select_related("user", "account")
        .filter(account=account, user__username=email.strip().lower())
        .first()
    )


def invitations_pending(*, account: Account) -> QuerySet[Invitation]:
    return Invitation.objects.filter(
        account=account, accepted_at__isnull=True, revoked_at__isnull=True, expires_at__gt=timezone.now()
    ).order_by("-created_at")


def membership_account_id(*, user_id: int) -> int | None:
    """The account a user is a member of now, or None (removed)."""
    return Membership.objects.filter(user_id=user_id).values_list("account_id", flat=True).first()


def owner_emails(*, account: Account) -> list[str]:
    """Where the account's own mail (alerts) goes: its owners' addresses."""
    rows = Membership.objects.filter(account=account, role="owner").select_related("user").order_by("created_at")
    return [m.user.email or m.user.get_username() for m in rows]


def account_owner_emails(*, account: Account) -> list[str]:
    """Where an account's alerts are emailed: its owners' addresses (members with the owner role)."""
    return [e for e in owner_emails(account=account) if "@" in e]


def user_is_account_owner(*, user: object, account: Account) -> bool:
    """Whether a signed-in user may change the account's owner-only settings (alerts)."""
    user_id = getattr(user, "pk", None)
    return user_id is not None and Membership.objects.filter(account=account, user_id=user_id, role="owner").exists()
