"""Staff REST API for accounts, API keys and credit grants (a staff session or an `admin`-scope key).

Money goes in and out as decimal strings of credits. A key's secret appears in
the response that creates it and nowhere else.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction
from django.shortcuts import get_object_or_404
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.models import SCOPES, Account, ApiKey
from accounts.services import (
    account_create,
    account_user_create,
    api_key_create,
    api_key_revoke,
    api_key_set_budget,
)
from billing.selectors import key_budget_document
from billing.services import InsufficientCredits, InvalidAmount, credits_grant
from core.credits import AmountError, format_credits, parse_credits

MAX_PAGE = 500


def drf_error(exc: ValidationError) -> serializers.ValidationError:
    if hasattr(exc, "error_dict"):
        return serializers.ValidationError({k: [m for e in v for m in e.messages] for k, v in exc.error_dict.items()})
    return serializers.ValidationError({"__all__": exc.messages})


def _page(request: Request) -> tuple[int, int]:
    try:
        limit = min(MAX_PAGE, max(1, int(request.query_params.get("limit", 100))))
        offset = max(0, int(request.query_params.get("offset", 0)))
    except ValueError:
        raise serializers.ValidationError({"limit": ["limit and offset must be integers"]}) from None
    return limit, offset


def account_document(account: Account) -> dict[str, Any]:
    return {
        "id": account.pk,
        "name": account.name,
        "balance": format_credits(account.available),
        "reserved": format_credits(account.reserved),
        "created_at": account.created_at.isoformat(),
    }


def key_document(api_key: ApiKey) -> dict[str, Any]:
    return {
        "id": api_key.pk,
        "account": api_key.account_id,
        "name": api_key.name,
        "prefix": api_key.prefix,
        "scopes": api_key.scopes,
        "models": api_key.allowed_models,
        "rate_limit": {"rpm": api_key.rpm, "tpm": api_key.tpm},
        "budget": key_budget_document(api_key_id=api_key.pk, monthly_budget=api_key.monthly_budget),
        "priority": api_key.priority,
        "expires_at": api_key.expires_at.isoformat() if api_key.expires_at else None,
        "revoked_at": api_key.revoked_at.isoformat() if api_key.revoked_at else None,
        "last_used_at": api_key.last_used_at.isoformat() if api_key.last_used_at else None,
        "created_at": api_key.created_at.isoformat(),
    }


class AccountIn(serializers.Serializer):
    name = serializers.CharField(max_length=200)
    owner = serializers.EmailField(required=False, help_text="creates this customer's dashboard login")
    password = serializers.CharField(required=False, write_only=True, min_length=8)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if attrs.get("owner") and not attrs.get("password"):
            raise serializers.ValidationError({"password": ["required with owner"]})
        return attrs


class AccountListApi(APIView):
    """GET: accounts by name (?limit, ?offset). POST: {name, owner?, password?} creates one."""

    def get(self, request: Request) -> Response:
        limit, offset = _page(request)
        accounts = Account.objects.order_by("name")[offset : offset + limit]
        return Response({"data": [account_document(a) for a in accounts]})

    def post(self, request: Request) -> Response:
        data = AccountIn(data=request.data)
        data.is_valid(raise_exception=True)
        try:
            with transaction.atomic():
                account = account_create(name=data.validated_data["name"], actor=request.user, via="api")
                if data.validated_data.get("owner"):
                    account_user_create(
                        account=account, email=data.validated_data["owner"], password=data.validated_data["password"]
                    )
        except ValidationError as exc:
            raise drf_error(exc) from None
        return Response(account_document(account), status=status.HTTP_201_CREATED)


class AccountDetailApi(APIView):
    def get(self, request: Request, account_id: int) -> Response:
        return Response(account_document(get_object_or_404(Account, pk=account_id)))


class CreditGrantIn(serializers.Serializer):
    amount = serializers.CharField(help_text="credits as a decimal string; negative removes")
    note = serializers.CharField(max_length=2000)

    def validate_amount(self, value: str) -> int:
        try:
            micro = parse_credits(value, allow_negative=True)
        except AmountError as exc:
            raise serializers.ValidationError(str(exc)) from None
        if micro == 0:
            raise serializers.ValidationError("must not be zero")
        return micro


class CreditGrantApi(APIView):
    """POST {amount, note}: grant (or remove) credits; answers the account and the ledger entry."""

    def post(self, request: Request, account_id: int) -> Response:
        account = get_object_or_404(Account, pk=account_id)
        data = CreditGrantIn(data=request.data)
        data.is_valid(raise_exception=True)
        amount, note = data.validated_data["amount"], data.validated_data["note"].strip()
        try:
            entry = credits_grant(account=account, amount=amount, actor=request.user, note=note, via="api")
        except (InsufficientCredits, InvalidAmount) as exc:
            raise serializers.ValidationError({"amount": [str(exc)]}) from None
        account.refresh_from_db()
        return Response(
            {"account": account_document(account), "ledger_entry": entry.pk, "amount": format_credits(amount)},
            status=status.HTTP_201_CREATED,
        )


class KeyIn(serializers.Serializer):
    name = serializers.CharField(max_length=100, required=False, allow_blank=True, default="")
    scopes = serializers.ListField(child=serializers.ChoiceField(choices=SCOPES), required=False)
    models = serializers.ListField(child=serializers.CharField(max_length=200), required=False, default=list)
    rpm = serializers.IntegerField(min_value=1, required=False, allow_null=True, default=None)
    tpm = serializers.IntegerField(min_value=1, required=False, allow_null=True, default=None)
    expires_at = serializers.DateTimeField(required=False, allow_null=True, default=None)
    budget = serializers.CharField(
        required=False, allow_null=True, default=None, help_text="credits per calendar month (UTC); null: no cap"
    )
    priority = serializers.ChoiceField(
        choices=["high", "normal", "low"], required=False, default="normal", help_text="its turn at capacity"
    )

    def validate_budget(self, value: str | None) -> int | None:
        return _budget(value)


def _budget(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        micro = parse_credits(value, field="budget")
    except AmountError as exc:
        raise serializers.ValidationError(str(exc)) from None
    if micro == 0:
        raise serializers.ValidationError("budget: must be positive (null removes the budget)")
    return micro


class KeyBudgetIn(serializers.Serializer):
    budget = serializers.CharField(allow_null=True, help_text="credits per calendar month (UTC); null: no cap")

    def validate_budget(self, value: str | None) -> int | None:
        return _budget(value)


class AccountKeysApi(APIView):
    """GET: the account's keys. POST: create one; the answer's `secret` is the only time it is shown."""

    def get(self, request: Request, account_id: int) -> Response:
        account = get_object_or_404(Account, pk=account_id)
        keys = ApiKey.objects.filter(account=account).order_by("-created_at")
        return Response({"data": [key_document(k) for k in keys]})

    def post(self, request: Request, account_id: int) -> Response:
        account = get_object_or_404(Account, pk=account_id)
        data = KeyIn(data=request.data)
        data.is_valid(raise_exception=True)
        v = data.validated_data
        try:
            created = api_key_create(
                account=account,
                name=v["name"],
                scopes=v.get("scopes"),
                allowed_models=v["models"],
                rpm=v["rpm"],
                tpm=v["tpm"],
                expires_at=v["expires_at"],
                monthly_budget=v["budget"],
                priority=v["priority"],
                actor=request.user,
                via="api",
            )
        except ValidationError as exc:
            raise drf_error(exc) from None
        body = {**key_document(created.api_key), "secret": created.secret}
        response = Response(body, status=status.HTTP_201_CREATED)
        response["Cache-Control"] = "no-store"
        return response


class KeyListApi(APIView):
    """GET: keys of every account, newest first (?account=ID, ?limit, ?offset)."""

    def get(self, request: Request) -> Response:
        limit, offset = _page(request)
        keys = ApiKey.objects.order_by("-created_at")
        account = request.query_params.get("account")
        if account:
            if not account.isdigit():
                raise serializers.ValidationError({"account": ["must be an account id"]})
            keys = keys.filter(account_id=int(account))
        return Response({"data": [key_document(k) for k in keys[offset : offset + limit]]})


class KeyDetailApi(APIView):
    def get(self, request: Request, key_id: int) -> Response:
        return Response(key_document(get_object_or_404(ApiKey, pk=key_id)))


class KeyRevokeApi(APIView):
    """POST: revoke the key (idempotent)."""

    def post(self, request: Request, key_id: int) -> Response:
        api_key = get_object_or_404(ApiKey, pk=key_id)
        api_key_revoke(api_key=api_key, actor=request.user, via="api")
        return Response(key_document(api_key))


class KeyBudgetApi(APIView):
    """POST {budget}: set the key's monthly budget in credits (null removes it); answers the key."""

    def post(self, request: Request, key_id: int) -> Response:
        api_key = get_object_or_404(ApiKey, pk=key_id)
        data = KeyBudgetIn(data=request.data)
        data.is_valid(raise_exception=True)
        try:
            api_key_set_budget(
                api_key=api_key, monthly_budget=data.validated_data["budget"], actor=request.user, via="api"
            )
        except ValidationError as exc:
            raise drf_error(exc) from None
        return Response(key_document(api_key))
