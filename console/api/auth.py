"""DRF authentication for the staff API: a staff session or an `admin`-scope key."""

from __future__ import annotations

from typing import Any

from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.exceptions import AuthenticationFailed
from rest_framework.permissions import BasePermission
from rest_framework.request import Request

from accounts.key_cache import KeyInfo
from accounts.selectors import api_key_authenticate


class ApiKeyUser:
    """The principal of a request authenticated by an API key (not a Django user)."""

    is_authenticated = True
    is_staff = False
    is_active = True

    def __init__(self, key: KeyInfo) -> None:
        self.key = key
        self.username = f"apikey:{key.prefix}"

    def __str__(self) -> str:
        return self.username


class ApiKeyAuthentication(BaseAuthentication):
    def authenticate(self, request: Request) -> tuple[ApiKeyUser, KeyInfo] | None:
        header = get_authorization_header(request).decode(errors="replace")
        if not header.lower().startswith("bearer "):
            return None
        result = api_key_authenticate(raw_key=header[7:].strip())
        if result.key is None:
            raise AuthenticationFailed(f"invalid API key ({result.reason})")
        return ApiKeyUser(result.key), result.key

    def authenticate_header(self, request: Request) -> str:
        return "Bearer"


class IsStaffOrAdminKey(BasePermission):
    def has_permission(self, request: Request, view: Any) -> bool:
        user = request.user
        if isinstance(user, ApiKeyUser):
            return "admin" in user.key.scopes
        return bool(user and user.is_authenticated and user.is_active and user.is_staff)
