"""WebSocket for the dashboard's live usage feed (/ws/usage/)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from accounts.selectors import membership_account_id
from console import live
from console.dashboard.selectors import account_for_user, summary_event
from console.live import usage_group

SUMMARY_INTERVAL = 1.0  # seconds between the overview cards' updates on one socket


class UsageConsumer(AsyncJsonWebsocketConsumer):
    """Joins the signed-in customer's account group; receive-only for the client."""

    group: str | None = None
    account_id: int | None = None
    _summary_at = float("-inf")
    _member_checked_at = float("-inf")
    user_id: Any = None
    _trailing: asyncio.Task[None] | None = None

    async def connect(self) -> None:
        user = self.scope.get("user")
        account = None
        if user is not None and user.is_authenticated:
            account = await database_sync_to_async(account_for_user)(user=user)
        if account is None:
            await self.close(code=4403)
            return
        self.group = usage_group(account.pk)
        await self.channel_layer.group_add(self.group, self.channel_name)
        self.account_id = account.pk
        self.user_id = user.pk
        self._member_checked_at = time.monotonic()
        await live.watch(account.pk)
        await self.accept()

    async def disconnect(self, code: int) -> None:
        if self.group is not None:
            await self.channel_layer.group_discard(self.group, self.channel_name)
        if self._trailing is not None:
            self._trailing.cancel()
        if self.account_id is not None:
            await live.unwatch(self.account_id)
            self.account_id = None

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        """Clients have nothing to say; ignore whatever they send."""

    async def _still_member(self) -> bool:
        """A member removed from the account stops getting its feed: the membership is read again
        at most once a second while events flow (the same pace as the summary query)."""
        if time.monotonic() - self._member_checked_at < SUMMARY_INTERVAL:
            return True
        self._member_checked_at = time.monotonic()
        account = await database_sync_to_async(membership_account_id)(user_id=self.user_id)
        return account == self.account_id

    async def usage_record(self, event: dict[str, Any]) -> None:
        if not await self._still_member():
            await self.close(code=4403)
            return
        message: dict[str, Any] = {"type": "usage", "usage": event["usage"]}
        # The overview cards follow too, at most once a second per socket: a burst of requests costs
        # one summary query a second, and a trailing one brings the cards to the burst's end.
        wait = SUMMARY_INTERVAL - (time.monotonic() - self._summary_at)
        if wait <= 0:
            message["summary"] = await self._summary()
        elif self._trailing is None or self._trailing.done():
            self._trailing = asyncio.create_task(self._send_summary_after(wait))
        await self.send_json(message)

    async def _summary(self) -> dict[str, Any]:
        self._summary_at = time.monotonic()
        assert self.account_id is not None
        return await database_sync_to_async(summary_event)(account_id=self.account_id)

    async def _send_summary_after(self, wait: float) -> None:
        await asyncio.sleep(wait)
        if self.account_id is not None:
            await self.send_json({"type": "summary", "summary": await self._summary()})
