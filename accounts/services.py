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
from accounts.models import DEFAULT_SCOPES, SCOPES, Account, ApiKey, Invitation, Membership, Role
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
        # The account's first login (createaccount --owner, the admin's add form) owns it.
        Membership.objects.create(user=user, account=account, role=Role.OWNER)
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
        _audit(
            actor,
            "key.create",
            api_key,
            via=via,
            scopes=api_key.scopes,
            models=api_key.allowed_models,
            budget=_budget_words(api_key.monthly_budget),
        )
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
        _audit(actor, "key.budget", api_key, via=via, budget=_budget_words(monthly_budget))
    key_cache.forget(api_key.digest)
    return api_key


def _budget_words(micro: int | None) -> str:
    """A key's budget as the audit log reads it: "5.000000 credits a month", or "none" once cleared."""
    return "none" if micro is None else f"{format_credits(micro)} credits a month"


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


# Teams: members, roles and invitations. Every change is audited in its own transaction.

INVITATION_TTL = timedelta(days=7)
_INVITATION_SALT = "accounts.invitation"


@dataclass(frozen=True)
class MemberChange:
    membership: Membership
    user_created: bool
    role_before: str | None  # None: the user was not a member before


@dataclass(frozen=True)
class CreatedInvitation:
    invitation: Invitation
    token: str  # goes into the emailed link only; the row keeps a digest of its nonce


def _clean_email(email: str) -> str:
    from django.core.validators import validate_email

    email = (email or "").strip().lower()
    try:
        validate_email(email)
    except ValidationError:
        raise ValidationError({"email": f"not an email address: {email!r}"}) from None
    return email


def _clean_role(role: str) -> str:
    if role not in Role.values:
        raise ValidationError({"role": f"unknown role {role!r}; choose from {', '.join(Role.values)}"})
    return role


def _refuse_last_owner(*, membership: Membership, what: str) -> None:
    """An account always keeps an owner: someone must be able to manage its members and budgets.
    Call it with the account's owner rows locked, so two concurrent removals cannot both pass."""
    if membership.role != Role.OWNER:
        return
    owners = list(Membership.objects.select_for_update().filter(account_id=membership.account_id, role=Role.OWNER))
    if not any(o.pk != membership.pk for o in owners):
        raise ValidationError({"email": f"{membership.user.get_username()} is the account's last owner; {what}"})


def member_add(
    *, account: Account, email: str, role: str, password: str = "", actor: object = "", via: str = ""
) -> MemberChange:
    """Add a member with a dashboard login at `email`, or change an existing member's role.

    A new user gets `password`; an existing user keeps theirs. A login belongs to one account:
    a member of another account is refused.
    """
    email = _clean_email(email)
    role = _clean_role(role)
    user_model = get_user_model()
    with transaction.atomic():
        user = user_model.objects.filter(username=email).first()
        created = user is None
        before: str | None = None
        if user is None:
            if not password:
                raise ValidationError({"password": "must not be empty for a new user"})
            user = user_model.objects.create_user(username=email, email=email, password=password)
            membership = Membership.objects.create(user=user, account=account, role=role)
        else:
            membership = Membership.objects.select_for_update().filter(user=user).first()  # type: ignore[assignment]
            if membership is not None and membership.account_id != account.pk:
                raise ValidationError({"email": f"{email} is a member of another account"})
            if membership is None:
                membership = Membership.objects.create(user=user, account=account, role=role)
            elif membership.role != role:
                before = membership.role
                _refuse_last_owner(membership=membership, what="make another member an owner first")
                membership.role = role
                membership.save(update_fields=["role"])
            else:
                before = role
        if before is None:
            _audit(actor, "member.add", account, via=via, email=email, role=role)
        elif before != role:
            _audit(actor, "member.role", account, via=via, email=email, role=role, role_before=before)
    return MemberChange(membership=membership, user_created=created, role_before=before)


def member_set_role(*, membership: Membership, role: str, actor: object = "", via: str = "") -> Membership:
    role = _clean_role(role)
    with transaction.atomic():
        # The stored role, not the instance's (a bound admin form has already changed the instance).
        current = Membership.objects.select_for_update().select_related("user").get(pk=membership.pk)
        before = current.role
        if before == role:
            membership.role = role
            return membership
        _refuse_last_owner(membership=current, what="make another member an owner first")
        Membership.objects.filter(pk=membership.pk).update(role=role)
        membership.role = role
        _audit(
            actor,
            "member.role",
            membership.account,
            via=via,
            email=membership.user.get_username(),
            role=role,
            role_before=before,
        )
    return membership


def member_remove(*, membership: Membership, actor: object = "", via: str = "") -> None:
    """Remove a member. The dashboard checks membership on every request, so their open sessions
    stop working at once; they are also deleted, so nothing of them lingers."""
    user = membership.user
    with transaction.atomic():
        _refuse_last_owner(membership=membership, what="make another member an owner before removing it")
        Membership.objects.filter(pk=membership.pk).delete()
        _audit(actor, "member.remove", membership.account, via=via, email=user.get_username(), role=membership.role)
    _sessions_delete(user_id=user.pk)


def _sessions_delete(*, user_id: Any) -> int:
    """Delete a user's stored sessions. Django keeps no index from user to session, so the unexpired
    ones are decoded; this runs only when a member is removed. Other session engines are covered by
    the per-request membership check alone."""
    from django.conf import settings
    from django.contrib.auth import SESSION_KEY
    from django.contrib.sessions.models import Session

    if settings.SESSION_ENGINE not in (
        "django.contrib.sessions.backends.db",
        "django.contrib.sessions.backends.cached_db",
    ):
        return 0
    from importlib import import_module

    store = import_module(settings.SESSION_ENGINE).SessionStore
    deleted = 0
    for session in Session.objects.filter(expire_date__gt=timezone.now()).iterator():
        if str(session.get_decoded().get(SESSION_KEY)) == str(user_id):
            store(session_key=session.session_key).delete()
            deleted += 1
    return deleted


def _nonce_digest(nonce: str) -> str:
    import hashlib

    return hashlib.sha256(nonce.encode()).hexdigest()


def invitation_create(
    *, account: Account, email: str, role: str, actor: object = "", via: str = ""
) -> CreatedInvitation:
    import secrets

    from django.core import signing

    from core.audit import actor_name

    email = _clean_email(email)
    role = _clean_role(role)
    existing = Membership.objects.filter(user__username=email).select_related("account").first()
    if existing is not None:
        where = "this account" if existing.account_id == account.pk else "another account"
        raise ValidationError({"email": f"{email} is already a member of {where}"})
    nonce = secrets.token_urlsafe(24)
    with transaction.atomic():
        invitation = Invitation.objects.create(
            account=account,
            email=email,
            role=role,
            nonce_digest=_nonce_digest(nonce),
            invited_by=actor_name(actor),
            expires_at=timezone.now() + INVITATION_TTL,
        )
        _audit(actor, "member.invite", account, via=via, email=email, role=role)
    token = signing.dumps({"i": invitation.pk, "n": nonce}, salt=_INVITATION_SALT, compress=True)
    return CreatedInvitation(invitation=invitation, token=token)


def invitation_send(*, invitation: Invitation, accept_url: str) -> None:
    """Mail the link through Django's email backend (console in the embedded default, SMTP at
    EMAIL_HOST/EMAIL_PORT when set). Called after the invitation's transaction committed."""
    from django.core.mail import send_mail

    days = INVITATION_TTL.days
    body = (
        f"You are invited to join {invitation.account.name} on SpeedInfer as a {invitation.role}.\n\n"
        f"Accept the invitation and set your password here (the link works once, for {days} days):\n"
        f"{accept_url}\n\nIf you did not expect this, ignore this email.\n"
    )
    send_mail(
        subject=f"Join {invitation.account.name} on SpeedInfer",
        message=body,
        from_email=None,
        recipient_list=[invitation.email],
    )


class InvitationInvalid(Exception):
    """A link that is malformed, forged, expired, revoked or already used; the message says which."""


def invitation_from_token(*, token: str) -> Invitation:
    from django.core import signing

    try:
        payload = signing.loads(token, salt=_INVITATION_SALT, max_age=INVITATION_TTL)
        invitation_id, nonce = int(payload["i"]), str(payload["n"])
    except signing.SignatureExpired:
        raise InvitationInvalid("This invitation has expired. Ask the account's owner for a new one.") from None
    except (signing.BadSignature, KeyError, TypeError, ValueError):
        raise InvitationInvalid("This invitation link is not valid.") from None
    invitation = Invitation.objects.select_related("account").filter(pk=invitation_id).first()
    if invitation is None or not _digests_equal(invitation.nonce_digest, _nonce_digest(nonce)):
        raise InvitationInvalid("This invitation link is not valid.")
    state = invitation.state
    if state == "accepted":
        raise InvitationInvalid("This invitation has already been used. Sign in instead.")
    if state == "revoked":
        raise InvitationInvalid("This invitation was withdrawn. Ask the account's owner for a new one.")
    if state == "expired":
        raise InvitationInvalid("This invitation has expired. Ask the account's owner for a new one.")
    return invitation


def _digests_equal(a: str, b: str) -> bool:
    import hmac

    return hmac.compare_digest(a.encode(), b.encode())


def invitation_accept(*, token: str, password: str) -> Membership:
    """Claim the invitation once and create the membership; a new user gets `password`, an existing
    user must give their current one. Raises InvitationInvalid or ValidationError({"password": ...})."""
    invitation = invitation_from_token(token=token)
    user_model = get_user_model()
    with transaction.atomic():
        # The conditional update is the single-use guard: of two concurrent accepts one claims the row.
        claimed = Invitation.objects.filter(
            pk=invitation.pk, accepted_at__isnull=True, revoked_at__isnull=True, expires_at__gt=timezone.now()
        ).update(accepted_at=timezone.now())
        if not claimed:
            raise InvitationInvalid("This invitation has already been used. Sign in instead.")
        user = user_model.objects.filter(username=invitation.email).first()
        if user is None:
            if not password:
                raise ValidationError({"password": "must not be empty"})
            from django.contrib.auth.password_validation import validate_password

            validate_password(password, user=user_model(username=invitation.email, email=invitation.email))
            user = user_model.objects.create_user(username=invitation.email, email=invitation.email, password=password)
        elif not user.check_password(password):
            raise ValidationError({"password": "not this user's password"})
        if Membership.objects.filter(user=user).exists():
            raise InvitationInvalid("You are already a member of an account; one login belongs to one account.")
        membership = Membership.objects.create(user=user, account=invitation.account, role=invitation.role)
        _audit(
            f"invitation:{invitation.email}",
            "member.add",
            invitation.account,
            via="invitation",
            email=invitation.email,
            role=invitation.role,
            invited_by=invitation.invited_by,
        )
    return membership


def invitation_revoke(*, invitation: Invitation, actor: object = "", via: str = "") -> None:
    with transaction.atomic():
        revoked = Invitation.objects.filter(pk=invitation.pk, accepted_at__isnull=True, revoked_at__isnull=True).update(
            revoked_at=timezone.now()
        )
        if revoked:
            _audit(actor, "member.invite_revoke", invitation.account, via=via, email=invitation.email)
