"""Requests in flight per worker: this process's own, exactly, and the whole fleet's, from Redis.

The request path reads memory only, never Redis. With REDIS_URL, a task per event loop (started by the
first routing decision, ended after IDLE_STOP_S with nothing in flight here) makes one pipelined round
trip every SYNC_INTERVAL_S: it writes this process's counts to the hash `si:inflight:DB:p:PROCESS` (which
expires after TTL_S, so a dead process's counts vanish with it), lists the processes in the set
`si:inflight:DB:procs` (DB: the database's name, one deployment), and reads the other processes'
hashes back into memory.

Nothing in Redis grows with gateway restarts: a process leaves the set when its sync task ends (shutdown,
idle), a process that died without leaving is pruned by the next sync of any other (its hash has
expired), and the set itself expires PROCS_TTL_S after the last sync of the last process.

Staleness: another process's counts are at most SYNC_INTERVAL_S + one round trip old (about 0.3 s),
and this process's own are exact. When no sync succeeded for TTL_S (Redis unreachable, or the first
request after an idle spell) the others count as 0 rather than as old figures. Without Redis (the
embedded default, one process) the fleet is this process.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import socket
import time
from typing import Any

from django.db import connection

from core import state
from workers.config import get_routing_config

log = logging.getLogger("speedinfer.routing")

SYNC_INTERVAL_S = 0.25
TTL_S = 2.0
# Every sync renews it; a whole fleet gone (stopped or killed) leaves nothing behind after this.
PROCS_TTL_S = 10.0
IDLE_STOP_S = 10.0
PROCESS = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"

_local: dict[str, int] = {}
_others: dict[str, int] = {}
_others_at = float("-inf")
# Per loop: the sync task (cancelled on reset; its finally withdraws this process's counts).
_tasks: state.LoopLocal[asyncio.Task[None]] = state.LoopLocal("workers.fleet.sync", close=state.cancel)


def _reset() -> None:
    global _others, _others_at
    _local.clear()
    _others, _others_at = {}, float("-inf")


state.register("workers.fleet", _reset)


def _namespace() -> str:
    # Worker ids are unique within one deployment, which is one database: processes of another
    # deployment sharing this Redis (or a parallel test run) must not add their counts to ours.
    return f"si:inflight:{connection.settings_dict['NAME']}:"


def processes_key() -> str:
    return _namespace() + "procs"


def process_key(process: str) -> str:
    return _namespace() + "p:" + process


def acquire(worker_id: str) -> None:
    _local[worker_id] = _local.get(worker_id, 0) + 1


def release(worker_id: str) -> None:
    count = _local.get(worker_id, 0) - 1
    if count > 0:
        _local[worker_id] = count
    else:
        _local.pop(worker_id, None)


def local_count(worker_id: str) -> int:
    return _local.get(worker_id, 0)


def in_flight(worker_id: str, *, now: float | None = None) -> int:
    """This process's calls to the worker plus the other processes' as of the last sync."""
    mine = _local.get(worker_id, 0)
    if (time.monotonic() if now is None else now) - _others_at >= TTL_S:
        return mine
    return mine + _others.get(worker_id, 0)


def view() -> dict[str, int]:
    """The fleet's in-flight count per worker, as this process sees it (admin, /metrics)."""
    now = time.monotonic()
    return {w: in_flight(w, now=now) for w in {*_local, *_others}}


def ensure_sync() -> None:
    """Start this event loop's sync task if it is not running (a dict lookup when it is)."""
    if not get_routing_config().redis_url:
        return
    task = _tasks.get()
    if task is None or task.done():
        _tasks.set(asyncio.get_running_loop().create_task(_sync_forever(), name="speedinfer-fleet-sync"))


async def stop() -> None:
    """End this loop's sync task and withdraw this process's counts (ASGI shutdown)."""
    task = _tasks.pop()
    if task is not None and not task.done():
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass


async def sync_once(
    client: Any, *, process: str, counts: dict[str, int], known: list[str]
) -> tuple[list[str], dict[str, int]]:
    """Publish `counts` as `process`'s and read the other processes in `known`: returns the processes
    registered now (to read on the next call: one round trip each time) and the others' totals."""
    mine = process_key(process)
    others = [p for p in known if p != process]
    async with client.pipeline(transaction=True) as pipe:
        pipe.delete(mine)
        if counts:
            pipe.hset(mine, mapping=counts)
            pipe.pexpire(mine, int(TTL_S * 1000))
        pipe.sadd(processes_key(), process)
        pipe.pexpire(processes_key(), int(PROCS_TTL_S * 1000))
        pipe.smembers(processes_key())
        for other in others:
            pipe.hgetall(process_key(other))
        results = await pipe.execute()
    hashes = results[len(results) - len(others) :] if others else []
    members = results[len(results) - len(others) - 1]
    totals: dict[str, int] = {}
    gone: list[str] = []
    for other, found in zip(others, hashes, strict=True):
        if not found:
            gone.append(other)  # expired or idle: it registers itself again when it has work
        for worker_id, count in found.items():
            key = worker_id.decode() if isinstance(worker_id, bytes) else str(worker_id)
            totals[key] = totals.get(key, 0) + int(count)
    if gone:
        await client.srem(processes_key(), *gone)
    return sorted(m.decode() if isinstance(m, bytes) else str(m) for m in members), totals


async def _sync_forever() -> None:
    global _others, _others_at
    import redis.asyncio as aioredis
    from redis.exceptions import RedisError

    client = aioredis.Redis.from_url(get_routing_config().redis_url, socket_connect_timeout=2, socket_timeout=2)
    known: list[str] = []
    idle_since: float | None = None
    warned = False
    try:
        while True:
            try:
                known, totals = await sync_once(client, process=PROCESS, counts=dict(_local), known=known)
                _others, _others_at = totals, time.monotonic()
                warned = False
            except (RedisError, OSError) as exc:
                if not warned:
                    log.warning(
                        "fleet in-flight sync failed (%s); routing on this process's counts", type(exc).__name__
                    )
                    warned = True
            now = time.monotonic()
            if _local:
                idle_since = None
            elif idle_since is None:
                idle_since = now
            elif now - idle_since >= IDLE_STOP_S:
                return
            await asyncio.sleep(SYNC_INTERVAL_S)
    finally:
        _others, _others_at = {}, float("-inf")
        try:
            await asyncio.shield(withdraw(client, process=PROCESS))
        except (RedisError, OSError, asyncio.CancelledError):
            pass
        await client.aclose()


async def withdraw(client: Any, *, process: str) -> None:
    """Remove `process`'s counts and its entry in the set of processes (its sync task ends)."""
    async with client.pipeline(transaction=True) as pipe:
        pipe.delete(process_key(process))
        pipe.srem(processes_key(), process)
        await pipe.execute()
