"""Writes for accounts, users and API keys."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from accounts import key_cache
from accounts.keys import generate_key, key_digest
from accounts.models import DEFAULT_SCOPES, SCOPES, Account, ApiKey, Membership
from catalog.models import PublicModel
from core.audit import audit_record
from core.credits import format_credits

LAST_USED_RESOLUTION = timedelta(minutes=1)


@dataclass(frozen=True)
class CreatedKey:
    api_key: ApiKey
    secret: str  # shown once, never stored


@transaction.atomic
def account_create(*, name: str, actor: object = "", via: str = "") -> Account:
    """A customer account. With an `actor` (staff, a command), the change is audited in its transaction."""
    name = name.strip()
    if not name:
        raise ValidationError({"name": "must not be empty"})
    if Account.objects.filter(name=name).exists():
        raise ValidationError({"name": f"an account named {name!r} already exists"})
    account = Account(name=name)
    account.full_clean()
    account.save()
    _audit(actor, "account.create", account, via=via)
    return account


def account_ceilings_set(
    *, account: Account, rpm_ceiling: int | None, tpm_ceiling: int | None, actor: object = "", via: str = ""
) -> Account:
    """Staff's per-key rate ceilings for an account (None: no ceiling).

    Existing keys above a new ceiling keep their stored limit but are held to the
    ceiling by the rate limiter (accounts.selectors), within SPEEDINFER_KEY_CACHE_TTL.
    """
    for field, value in (("rpm_ceiling", rpm_ceiling), ("tpm_ceiling", tpm_ceiling)):
        if value is not None and value < 1:
            raise ValidationError({field: "must be a positive integer"})
    with transaction.atomic():
        Account.objects.filter(pk=account.pk).update(rpm_ceiling=rpm_ceiling, tpm_ceiling=tpm_ceiling)
        _audit(actor, "account.ceilings", account, via=via, rpm_ceiling=rpm_ceiling, tpm_ceiling=tpm_ceiling)
    account.rpm_ceiling, account.tpm_ceiling = rpm_ceiling, tpm_ceiling
    for digest in ApiKey.objects.filter(account=account).values_list("digest", flat=True):
        key_cache.forget(digest)
    return account


def account_user_create(*, account: Account, email: str, password: str) -> AbstractBaseUser:
    """A customer login for the dashboard, tied to one account."""
    user_model = get_user_model()
    email = email.strip().lower()
    if not email or "@" not in email:
        raise ValidationError({"owner": f"not an email address: {email!r}"})
    if user_model.objects.filter(username=email).exists():
        raise ValidationError({"owner": f"a user {email!r} already exists"})
    if not password:
        raise ValidationError({"password": "must not be empty"})
    with transaction.atomic():
        user = user_model.objects.create_user(username=email, email=email, password=password)
        Membership.objects.create(user=user, account=account)
    return user


def _validate_scopes(scopes: Sequence[str]) -> list[str]:
    cleaned = []
    for scope in scopes:
        scope = scope.strip()
        if scope not in SCOPES:
            raise ValidationError({"scopes": f"unknown scope {scope!r}; choose from {', '.join(SCOPES)}"})
        if scope not in cleaned:
            cleaned.append(scope)
    if not cleaned:
        raise ValidationError({"scopes": "at least one scope is required"})
    return cleaned


def _within_ceilings(*, account: Account, rpm: int | None, tpm: int | None) -> tuple[int | None, int | None]:
    """A key's limits under its account's ceilings: none given inherits the ceiling, above it is refused."""
    limits: dict[str, int | None] = {"rpm": rpm, "tpm": tpm}
    for field, ceiling in (("rpm", account.rpm_ceiling), ("tpm", account.tpm_ceiling)):
        value = limits[field]
        if value is not None and value < 1:
            raise ValidationError({field: "must be a positive integer"})
        if ceiling is None:
            continue
        if value is None:
            limits[field] = ceiling
        elif value > ceiling:
            raise ValidationError(
                {field: f"{value} is above the account's ceiling of {ceiling}; ask staff to raise the ceiling"}
            )
    return limits["rpm"], limits["tpm"]


def api_key_create(
    *,
    account: Account,
    name: str = "",
    scopes: Sequence[str] | None = None,
    allowed_models: Sequence[str] = (),
    rpm: int | None = None,
    tpm: int | None = None,
    expires_at: datetime | None = None,
    monthly_budget: int | None = None,
    priority: str = "normal",
    actor: object = "",
    via: str = "",
) -> CreatedKey:
    clean_scopes = _validate_scopes(list(scopes) if scopes is not None else list(DEFAULT_SCOPES))
    models = [m.strip() for m in allowed_models if m.strip()]
    unknown = sorted(
        set(models) - set(PublicModel.objects.filter(model_id__in=models).values_list("model_id", flat=True))
    )
    if unknown:
        raise ValidationError({"models": f"unknown model {unknown[0]!r}"})
    rpm, tpm = _within_ceilings(account=account, rpm=rpm, tpm=tpm)
    if expires_at is not None and expires_at <= timezone.now():
        raise ValidationError({"expires": "must be in the future"})
    _validate_budget(monthly_budget)
    _validate_priority(priority)
    lookup, secret = generate_key()
    api_key = ApiKey(
        account=account,
        name=name.strip() or f"key-{lookup[:6]}",
        lookup_id=lookup,
        digest=key_digest(secret),
        scopes=clean_scopes,
        allowed_models=models,
        rpm=rpm,
        tpm=tpm,
        expires_at=expires_at,
        monthly_budget=monthly_budget,
        priority=priority,
    )
    api_key.full_clean()
    with transaction.atomic():
        api_key.save()
        _audit(actor, "key.create", api_key, via=via, scopes=api_key.scopes, models=api_key.allowed_models)
    return CreatedKey(api_key=api_key, secret=secret)


KEY_PRIORITIES = ("high", "normal", "low")


def _validate_priority(priority: str) -> None:
    if priority not in KEY_PRIORITIES:
        raise ValidationError({"priority": f"must be one of {', '.join(KEY_PRIORITIES)}"})


def api_key_set_priority(*, api_key: ApiKey, priority: str, actor: object = "", via: str = "") -> ApiKey:
    _validate_priority(priority)
    with transaction.atomic():
        ApiKey.objects.filter(pk=api_key.pk).update(priority=priority)
        api_key.priority = priority
        _audit(actor, "key.priority", api_key, via=via, priority=priority)
    key_cache.forget(api_key.digest)
    return api_key


def _validate_budget(monthly_budget: int | None) -> None:
    if monthly_budget is not None and monthly_budget <= 0:
        raise ValidationError({"budget": "must be a positive amount of credits"})


def api_key_set_budget(*, api_key: ApiKey, monthly_budget: int | None, actor: object = "", via: str = "") -> ApiKey:
    """Set (None: remove) the key's monthly budget in micro-credits; gateways apply it within
    SPEEDINFER_KEY_CACHE_TTL seconds. What the key spent this month still counts against a new budget."""
    _validate_budget(monthly_budget)
    with transaction.atomic():
        ApiKey.objects.filter(pk=api_key.pk).update(monthly_budget=monthly_budget)
        api_key.monthly_budget = monthly_budget
        _audit(actor, "key.budget", api_key, via=via, budget=_credits_or_none(monthly_budget))
    key_cache.forget(api_key.digest)
    return api_key


def _credits_or_none(micro: int | None) -> str | None:
    return None if micro is None else format_credits(micro)


def api_key_revoke(*, api_key: ApiKey, actor: object = "", via: str = "") -> ApiKey:
    """Revoke a key. Other processes notice within SPEEDINFER_KEY_CACHE_TTL seconds. Idempotent."""
    with transaction.atomic():
        revoked = ApiKey.objects.filter(pk=api_key.pk, revoked_at__isnull=True).update(revoked_at=timezone.now())
        if revoked:
            _audit(actor, "key.revoke", api_key, via=via)
    api_key.refresh_from_db(fields=["revoked_at"])
    key_cache.forget(api_key.digest)
    return api_key


def api_key_touch(*, key_id: int) -> None:
    """Record use, at most once per LAST_USED_RESOLUTION, with a conditional update."""
    now = timezone.now()
    ApiKey.objects.filter(pk=key_id).exclude(last_used_at__gte=now - LAST_USED_RESOLUTION).update(last_used_at=now)


def _audit(actor: object, action: str, target: object, **detail: Any) -> None:
    """The services' own audit rows: written when a person or command (`actor`) made the change."""
    if actor:
        audit_record(actor=actor, action=action, target=target, detail={k: v for k, v in detail.items() if v != ""})


def api_key_update(
    *,
    api_key: ApiKey,
    name: str,
    scopes: Sequence[str],
    allowed_models: Sequence[str],
    rpm: int | None,
    tpm: int | None,
    expires_at: datetime | None,
    actor: object = "",
    via: str = "",
) -> ApiKey:
    """Change a key's settings; other processes see it within SPEEDINFER_KEY_CACHE_TTL seconds."""
    clean_scopes = _validate_scopes(list(scopes))
    wanted = [m.strip() for m in allowed_models if m.strip()]
    known = set(PublicModel.objects.filter(model_id__in=wanted).values_list("model_id", flat=True))
    unknown = sorted(set(wanted) - known)
    if unknown:
        raise ValidationError({"models": f"unknown model {unknown[0]!r}"})
    rpm, tpm = _within_ceilings(account=api_key.account, rpm=rpm, tpm=tpm)
    fields = ("name", "scopes", "allowed_models", "rpm", "tpm", "expires_at")
    before = {f: getattr(api_key, f) for f in fields}
    api_key.name = name.strip() or api_key.name
    api_key.scopes = clean_scopes
    api_key.allowed_models = wanted
    api_key.rpm = rpm
    api_key.tpm = tpm
    api_key.expires_at = expires_at
    api_key.full_clean()
    with transaction.atomic():
        api_key.save(update_fields=list(fields))
        changed = [f for f in fields if getattr(api_key, f) != before[f]]
        _audit(actor, "key.update", api_key, via=via, changed=changed, scopes=clean_scopes, models=wanted)
    key_cache.forget(api_key.digest)
    return api_key
