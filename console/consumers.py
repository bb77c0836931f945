"""WebSocket for the dashboard's live usage feed (/ws/usage/)."""

from __future__ import annotations

from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from console import live
from console.dashboard.selectors import account_for_user
from console.live import usage_group


class UsageConsumer(AsyncJsonWebsocketConsumer):
    """Joins the signed-in customer's account group; receive-only for the client."""

    group: str | None = None
    account_id: int | None = None

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
        await live.watch(account.pk)
        await self.accept()

    async def disconnect(self, code: int) -> None:
        if self.group is not None:
            await self.channel_layer.group_discard(self.group, self.channel_name)
        if self.account_id is not None:
            await live.unwatch(self.account_id)
            self.account_id = None

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        """Clients have nothing to say; ignore whatever they send."""

    async def usage_record(self, event: dict[str, Any]) -> None:
        await self.send_json({"type": "usage", "usage": event["usage"]})
