"""Writes for spend alerts: the settings, the crossing check, and delivery with retries.

Alerts go out only from `alerts_send` (manage.py sendalerts, the schedule), never from the request path.
The check claims each crossing with a conditional update or a unique row in the transaction that records
its event, so two overlapping runs raise it once; delivery does its network I/O outside any transaction,
after claiming the delivery row with a conditional update.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

import httpx
from django.conf import settings
from django.core import mail
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.utils import timezone

from accounts.models import Account, ApiKey
from accounts.selectors import account_owner_emails
from alerts.models import AlertDelivery, AlertEvent, AlertSettings, KeyBudgetCrossing
from alerts.webhooks import SIGNATURE_HEADER, event_body, new_signing_secret, signature_header
from billing.ledger import month_start
from billing.models import KeySpend
from core.audit import audit_record
from core.credits import display_credits, format_credits, parse_credits

log = logging.getLogger(__name__)

PERCENT_MIN, PERCENT_MAX = 1, 1000
# The first retry comes at the first run at least this long after a failed attempt; each later wait is
# RETRY_FACTOR times the one before, at most RETRY_MAX; a failure once RETRY_WINDOW has passed since the
# first attempt is final.
RETRY_FIRST = timedelta(seconds=10)
RETRY_FACTOR = 3
RETRY_MAX = timedelta(hours=1)
RETRY_WINDOW = timedelta(hours=24)
# A claimed delivery is left alone by other runs this long (well beyond the send's timeouts).
CLAIM_LEASE = timedelta(seconds=60)
WEBHOOK_TIMEOUT = httpx.Timeout(5.0, connect=3.0)
EMAIL_TIMEOUT = 10.0
WEBHOOK_OFF = "the webhook was turned off"


class _Unset:
    pass


UNSET: Any = _Unset()


def webhook_url_validate(url: str) -> str:
    """An http(s) URL with a host and no credentials in it (they would sit in the database and the audit)."""
    url = url.strip()
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise ValidationError({"webhook": f"must be an http:// or https:// URL, not {url[:80]!r}"})
    if "@" in parts.netloc:
        raise ValidationError({"webhook": "must not contain credentials (user:password@); sign with the secret"})
    if not parts.hostname:
        raise ValidationError({"webhook": f"has no host: {url[:80]!r}"})
    if len(url) > 500:
        raise ValidationError({"webhook": "at most 500 characters"})
    return url


def budget_percents_validate(percents: Sequence[int]) -> list[int]:
    for p in percents:
        if not PERCENT_MIN <= p <= PERCENT_MAX:
            raise ValidationError({"budget_percent": f"each must be a whole number from 1 to 1000, not {p}"})
    return sorted(set(percents))


@dataclass(frozen=True)
class AlertSettingsChange:
    settings: AlertSettings
    secret: str | None  # the new webhook signing secret, to show once; None when it did not change


def alert_settings_set(
    *,
    account: Account,
    low_balance: int | None = UNSET,
    webhook_url: str = UNSET,
    budget_percents: Sequence[int] = UNSET,
    rotate_secret: bool = False,
    actor: object = "",
    via: str = "",
) -> AlertSettingsChange:
    """Change what is given (UNSET leaves a setting as it is); audited. A new webhook URL, or
    rotate_secret, makes a new signing secret, returned once. An empty URL turns the webhook off."""
    if low_balance is not UNSET and low_balance is not None and low_balance <= 0:
        raise ValidationError({"low_balance": "must be more than 0 credits (or none to turn it off)"})
    if webhook_url is not UNSET and webhook_url.strip():
        webhook_url = webhook_url_validate(webhook_url)
    if budget_percents is not UNSET:
        budget_percents = budget_percents_validate(budget_percents)
    with transaction.atomic():
        row, _ = AlertSettings.objects.select_for_update().get_or_create(account=account)
        changed: list[str] = []
        secret = None
        if low_balance is not UNSET and low_balance != row.low_balance:
            row.low_balance = low_balance
            # A new threshold is a new line to cross: the next check compares against it afresh.
            row.balance_below = False
            changed.append("low_balance")
        if webhook_url is not UNSET:
            url = webhook_url.strip()
            if url != row.webhook_url:
                changed.append("webhook_url")
            if url and (url != row.webhook_url or rotate_secret or not row.webhook_secret):
                secret = new_signing_secret()
                row.webhook_secret = secret
                changed.append("webhook_secret")
            elif not url:
                row.webhook_secret = ""
            row.webhook_url = url
        if budget_percents is not UNSET and list(budget_percents) != row.budget_percents:
            row.budget_percents = list(budget_percents)
            changed.append("budget_percents")
        row.updated_at = timezone.now()
        row.save()
        if actor and changed:
            audit_record(
                actor=actor,
                action="alerts.update",
                target=account,
                detail={
                    "via": via,
                    "changed": changed,
                    "low_balance": None if row.low_balance is None else format_credits(row.low_balance),
                    "webhook_url": row.webhook_url or None,
                    "budget_percents": row.budget_percents,
                },  # never the secret
            )
    return AlertSettingsChange(settings=row, secret=secret)


def _account_doc(account: Account) -> dict[str, Any]:
    return {"id": account.pk, "name": account.name}


def _event_raise(*, account: Account, row: AlertSettings, type: str, data: dict[str, Any]) -> AlertEvent:
    """Inside the caller's transaction: the event and one delivery per owner and per webhook."""
    event = AlertEvent.objects.create(type=type, account=account, data=data)
    deliveries = [
        AlertDelivery(event=event, channel=AlertDelivery.Channel.EMAIL, target=email)
        for email in account_owner_emails(account=account)
    ]
    if row.webhook_url:
        deliveries.append(AlertDelivery(event=event, channel=AlertDelivery.Channel.WEBHOOK, target=row.webhook_url))
    AlertDelivery.objects.bulk_create(deliveries)
    return event


def _check_balances() -> list[AlertEvent]:
    raised: list[AlertEvent] = []
    rows = AlertSettings.objects.filter(low_balance__isnull=False).select_related("account")
    for row in rows:
        account = row.account
        threshold = row.low_balance
        assert threshold is not None
        below = account.available < threshold
        if not below:
            if row.balance_below:
                # Back at or above the line (a top-up): the next fall alerts again.
                AlertSettings.objects.filter(pk=row.pk, balance_below=True).update(balance_below=False)
            continue
        if row.balance_below:
            continue  # this dip was alerted already
        with transaction.atomic():
            claimed = AlertSettings.objects.filter(pk=row.pk, balance_below=False, low_balance=threshold).update(
                balance_below=True
            )
            if claimed:
                data = {"available": format_credits(account.available), "threshold": format_credits(threshold)}
                raised.append(_event_raise(account=account, row=row, type=AlertEvent.Type.BALANCE_LOW, data=data))
    return raised


def _check_key_budgets(*, now: datetime) -> list[AlertEvent]:
    raised: list[AlertEvent] = []
    month = month_start(now)
    rows = {r.pk: r for r in AlertSettings.objects.exclude(budget_percents=[]).select_related("account")}
    if not rows:
        return raised
    keys = list(
        ApiKey.objects.filter(account_id__in=rows, monthly_budget__isnull=False, revoked_at__isnull=True).only(
            "id", "account_id", "name", "lookup_id", "monthly_budget"
        )
    )
    spent = dict(KeySpend.objects.filter(api_key__in=keys, month=month).values_list("api_key_id", "spent"))
    done = set(KeyBudgetCrossing.objects.filter(api_key__in=keys, month=month).values_list("api_key_id", "percent"))
    for key in keys:
        budget = key.monthly_budget
        assert budget is not None
        row = rows[key.account_id]
        key_spent = spent.get(key.pk, 0)
        for percent in row.budget_percents:
            if (key.pk, percent) in done or key_spent * 100 < budget * percent:
                continue
            try:
                with transaction.atomic():
                    KeyBudgetCrossing.objects.create(api_key=key, month=month, percent=percent)
                    data = {
                        "key": {"id": key.pk, "name": key.name, "prefix": key.prefix},
                        "percent": percent,
                        "budget": format_credits(budget),
                        "spent": format_credits(key_spent),
                        "month": f"{month:%Y-%m}",
                    }
                    raised.append(
                        _event_raise(account=row.account, row=row, type=AlertEvent.Type.KEY_BUDGET, data=data)
                    )
            except IntegrityError:
                continue  # another run raised this crossing first
    return raised


def alerts_check(*, now: datetime | None = None) -> list[AlertEvent]:
    """Raise an event for every crossing since the last check (each crossing once)."""
    now = now or datetime.now(UTC)
    return _check_balances() + _check_key_budgets(now=now)


def retry_delay(*, attempts: int) -> timedelta:
    """The wait after the `attempts`-th failed attempt: 10 s, 30 s, 90 s, ... at most an hour."""
    delay = RETRY_FIRST * (RETRY_FACTOR ** max(attempts - 1, 0))
    return min(delay, RETRY_MAX)


def _email_text(event: AlertEvent) -> tuple[str, str]:
    data = event.data
    name = event.account.name
    if event.type == AlertEvent.Type.BALANCE_LOW:
        available = display_credits(parse_credits(data["available"]))
        threshold = display_credits(parse_credits(data["threshold"]))
        subject = f"SpeedInfer: {name}'s balance is below {threshold} credits"
        body = (
            f"The available balance of {name} is {available} credits, below the alert threshold of "
            f"{threshold} credits.\nAdd credits before requests are refused with 402.\n"
        )
    else:
        key = data["key"]
        subject = f"SpeedInfer: key {key['name']} has spent {data['percent']}% of its monthly budget"
        body = (
            f"The API key {key['name']} ({key['prefix']}) of {name} has spent "
            f"{display_credits(parse_credits(data['spent']))} of its {display_credits(parse_credits(data['budget']))} "
            f"credits budget for {data['month']} ({data['percent']}% or more).\n"
        )
    return subject, body + f"\nEvent {event.id}\n"


@dataclass
class _Outcome:
    ok: bool
    status_code: int | None = None
    error: str = ""


def _send_email(delivery: AlertDelivery) -> _Outcome:
    subject, body = _email_text(delivery.event)
    try:
        connection = mail.get_connection(timeout=EMAIL_TIMEOUT)
        sent = mail.EmailMessage(subject, body, settings.DEFAULT_FROM_EMAIL, [delivery.target], connection=connection)
        sent.extra_headers["X-SpeedInfer-Event"] = delivery.event_id
        sent.send()
    except Exception as exc:  # smtplib and socket errors alike: retried
        return _Outcome(ok=False, error=f"{type(exc).__name__}: {exc}"[:300])
    return _Outcome(ok=True)


def _send_webhook(delivery: AlertDelivery, *, client: httpx.Client, secret: str) -> _Outcome:
    event = delivery.event
    body = event_body(
        event_id=event.id, type=event.type, created=event.created, account=_account_doc(event.account), data=event.data
    )
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "SpeedInfer-Webhook/1",
        SIGNATURE_HEADER: signature_header(secret=secret, timestamp=int(time.time()), body=body),
    }
    try:
        response = client.post(delivery.target, content=body, headers=headers)
    except httpx.HTTPError as exc:
        return _Outcome(ok=False, error=f"{type(exc).__name__}: {exc}"[:300])
    if 200 <= response.status_code < 300:
        return _Outcome(ok=True, status_code=response.status_code)
    return _Outcome(ok=False, status_code=response.status_code, error=f"HTTP {response.status_code}")


@dataclass(frozen=True)
class DeliveryCounts:
    delivered: int = 0
    retrying: int = 0
    failed: int = 0


def alerts_deliver(*, limit: int = 500) -> DeliveryCounts:
    """Attempt every delivery that is due; each outcome recorded with its retry time or final status."""
    now = timezone.now()
    due = list(
        AlertDelivery.objects.filter(status=AlertDelivery.Status.PENDING, next_attempt_at__lte=now)
        .select_related("event__account__alert_settings")
        .order_by("next_attempt_at", "id")[:limit]
    )
    delivered = retrying = failed = 0
    with httpx.Client(timeout=WEBHOOK_TIMEOUT, follow_redirects=False) as client:
        for delivery in due:
            claimed = AlertDelivery.objects.filter(
                pk=delivery.pk, status=AlertDelivery.Status.PENDING, next_attempt_at=delivery.next_attempt_at
            ).update(next_attempt_at=now + CLAIM_LEASE)
            if not claimed:
                continue  # another run has it
            if delivery.channel == AlertDelivery.Channel.EMAIL:
                outcome = _send_email(delivery)
            else:
                # The account's webhook as it is now: a retry follows a corrected URL, signed with the
                # current secret; a webhook turned off since ends the delivery.
                row = getattr(delivery.event.account, "alert_settings", None)
                if row is None or not row.webhook_url or not row.webhook_secret:
                    outcome = _Outcome(ok=False, error=WEBHOOK_OFF)
                else:
                    delivery.target = row.webhook_url
                    outcome = _send_webhook(delivery, client=client, secret=row.webhook_secret)
            status = _record(delivery=delivery, outcome=outcome)
            delivered += status == AlertDelivery.Status.DELIVERED
            retrying += status == AlertDelivery.Status.PENDING
            failed += status == AlertDelivery.Status.FAILED
    return DeliveryCounts(delivered=delivered, retrying=retrying, failed=failed)


def _record(*, delivery: AlertDelivery, outcome: _Outcome) -> str:
    at = timezone.now()
    first = delivery.first_attempt_at or at
    attempts = delivery.attempts + 1
    if outcome.ok:
        status, next_at = AlertDelivery.Status.DELIVERED, at
    elif at - first >= RETRY_WINDOW or outcome.error == WEBHOOK_OFF:
        status, next_at = AlertDelivery.Status.FAILED, at
    else:
        status, next_at = AlertDelivery.Status.PENDING, at + retry_delay(attempts=attempts)
    AlertDelivery.objects.filter(pk=delivery.pk).update(
        target=delivery.target,
        status=status,
        attempts=attempts,
        first_attempt_at=first,
        last_attempt_at=at,
        next_attempt_at=next_at,
        last_status_code=outcome.status_code,
        last_error=outcome.error,
    )
    if status != AlertDelivery.Status.DELIVERED:
        log.warning(
            "alert %s by %s: attempt %d %s (%s)", delivery.event_id, delivery.channel, attempts, status, outcome.error
        )
    return status


@dataclass(frozen=True)
class SendSummary:
    raised: int
    counts: DeliveryCounts


def alerts_send() -> SendSummary:
    """One run of the schedule's job: check for crossings, then deliver what is due."""
    raised = alerts_check()
    return SendSummary(raised=len(raised), counts=alerts_deliver())
