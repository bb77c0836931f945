"""Factories for every app, in one place."""

from __future__ import annotations

import itertools
from typing import Any

from accounts.models import Account
from accounts.services import CreatedKey, account_create, api_key_create
from billing.selectors import ledger_totals
from billing.services import credits_grant
from catalog.models import PublicModel
from catalog.services import model_register
from core.credits import MICRO

_seq = itertools.count(1)


def make_account(*, name: str | None = None, credits: int = 0) -> Account:
    account = account_create(name=name or f"account-{next(_seq)}")
    if credits:
        credits_grant(account=account, amount=credits * MICRO, actor="test")
        account.refresh_from_db()
    return account


def make_member(*, account: Account, email: str | None = None, role: str = "owner", password: str = "pw-" + "x" * 12):
    """A dashboard login that is a member of `account` with `role`."""
    from accounts.services import member_add

    return member_add(account=account, email=email or f"member-{next(_seq)}@example.com", role=role, password=password)


def make_model(
    *, model_id: str = "acme/model-1", input_price: int = 1 * MICRO, output_price: int = 2 * MICRO, **kwargs: Any
) -> PublicModel:
    model, _ = model_register(model_id=model_id, input_price=input_price, output_price=output_price, **kwargs)
    return model


def make_key(*, account: Account, **kwargs: Any) -> CreatedKey:
    return api_key_create(account=account, **kwargs)


def money(account: Account) -> tuple[int, int]:
    """The account's (available, reserved) as stored now, after checking that the ledger reconciles with them."""
    fresh = Account.objects.get(pk=account.pk)
    totals = ledger_totals(account=fresh)
    assert (totals.available, totals.reserved) == (fresh.available, fresh.reserved)
    return fresh.available, fresh.reserved
