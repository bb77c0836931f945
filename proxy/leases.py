"""One lease keeper per process (per event loop): every interval, one statement renews the lease of
every reservation the process is serving (docs/interface.md, Money invariants).

A request registers its hold when it is reserved and drops it when it ends; nothing runs per request.
The sweeper-safety rule is unchanged: a hold is renewed at most LEASE_RENEW_EVERY after it was taken or
last renewed, well inside LEASE, so the sweep never frees a running request's hold; a process that dies
stops renewing, and its holds go with the sweep.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from billing import services
from core import state

log = logging.getLogger("speedinfer.gateway")


class _Keeper:
    """This loop's held reservation ids and the task that renews them."""

    def __init__(self) -> None:
        self.held: set[Any] = set()
        self.task: asyncio.Task[None] | None = None
        self.renewals = 0  # statements sent (tests, metrics)

    def ensure_running(self) -> None:
        if self.task is None or self.task.done():
            self.task = asyncio.get_running_loop().create_task(self._run(), name="speedinfer-lease-keeper")

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        last = loop.time()
        while True:
            # Naps of at most a second, the interval read each time: a changed interval (tests) takes
            # effect at once, for one wake-up a second per process.
            due = last + services.LEASE_RENEW_EVERY.total_seconds()
            if loop.time() < due:
                await asyncio.sleep(min(1.0, due - loop.time()))
                continue
            last = loop.time()
            if not self.held:
                continue
            try:
                await services.reservation_renew_many_async(reservation_ids=list(self.held))
                self.renewals += 1
            except Exception:  # a database blip: every lease has room for the next interval's try
                log.warning("could not renew the leases of %d reservations", len(self.held), exc_info=True)

    def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()


_keepers: state.LoopLocal[_Keeper] = state.LoopLocal("proxy.leases", close=lambda keeper: keeper.stop())


def keeper() -> _Keeper:
    found = _keepers.get()
    if found is None:
        found = _keepers.set(_Keeper())
    return found


def hold(reservation_id: Any) -> None:
    """The request holds `reservation_id` until `drop`: its lease is renewed with the process's others."""
    found = keeper()
    found.held.add(reservation_id)
    found.ensure_running()


def drop(reservation_id: Any) -> None:
    found = _keepers.get()
    if found is not None:
        found.held.discard(reservation_id)
