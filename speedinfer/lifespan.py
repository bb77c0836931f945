"""ASGI lifespan: at start-up, replay the close journal of dead gateway processes (proxy.pending); on
shutdown, close this process's pooled upstream clients and database pool.

Both are per event loop (runtimes.http, core.pgpool); closing them at
shutdown ends keep-alive connections cleanly instead of leaving them to the
garbage collector.
"""

from __future__ import annotations

import logging
from typing import Any

from core.pgpool import close_pool
from proxy.billed import start_journal_replay
from runtimes.http import close_client
from workers import fleet

log = logging.getLogger(__name__)


async def lifespan_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            start_journal_replay()  # closes a gateway process that died had queued (proxy.pending)
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            try:
                await fleet.stop()
                await close_client()
                await close_pool()
            except Exception:
                log.exception("closing upstream clients at shutdown failed")
            await send({"type": "lifespan.shutdown.complete"})
            return
