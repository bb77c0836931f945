"""Capacity slots per worker and the gateway-side queue for a saturated model (docs/scheduler.md).

A worker with a capacity (runtime_config.max_concurrency, or the runtime's own figure: workers.routing
`_capacity`) runs at most that many requests from the gateways at once: each request holds a slot on its
worker from before the call until the answer (or the stream) ends. When every eligible worker of a model
with a capacity is full and none without one is eligible, the model's pool is saturated and the request
waits here, in the gateway, not in a runtime's queue:

- a freed slot goes to the waiting requests by priority (`high`, then `normal`), and within a priority
  to the waiting accounts in turn (round robin: an account with 30 waiting gets no more slots than one
  with 1);
- `low` is refused at once with 503 `overloaded` while the pool is saturated;
- a request that waited SPEEDINFER_QUEUE_TIMEOUT gets 503 `overloaded`.

The gateway takes the reservation only after the slot (proxy.gateway): a request that never ran held no
credits and is charged nothing.

Slots across gateway processes (with REDIS_URL): one sorted set per worker, `si:slots:DB:w:WORKER`, whose
members are the slots held (a token per request) scored by their lease's expiry in Redis's own clock. One
Lua script prunes expired leases and takes a slot on the first worker, in preference order, with room:
atomic, so two processes never overfill a worker. A task per event loop renews this process's leases every
LEASE_S / 3; a process that dies stops renewing and its slots come back within LEASE_S. Without Redis (the
embedded profile, one process) the same table is a dict. Each process queues its own waiters; the head of
each queue asks for a slot whenever one of this process's slots frees up, and every POLL_S otherwise (a
slot another process freed), so across processes a freed slot goes to whichever head asks first: fairness
and priority are exact within a process and approximate across them (docs/scheduler.md gives the
measured bound).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
import weakref
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import connection
from redis.exceptions import RedisError

from core import state as process_state
from workers import fleet

log = logging.getLogger("speedinfer.routing")

PRIORITIES = ("high", "normal", "low")
LEASE_S = 15.0
POLL_S = 0.02

_tokens = itertools.count(1)
_warned_at = float("-inf")  # the last "Redis unreachable" warning: one a minute, not one a request
# Requests this process has placed on each worker and not finished: from the slot to the answer's end,
# so a burst that has been placed but not yet forwarded (its reservation is being taken) already counts
# in the next selection's load (workers.routing).
_placed: dict[str, int] = {}


def _place(worker_id: str) -> None:
    _placed[worker_id] = _placed.get(worker_id, 0) + 1


def _unplace(worker_id: str) -> None:
    count = _placed.get(worker_id, 0) - 1
    if count > 0:
        _placed[worker_id] = count
    else:
        _placed.pop(worker_id, None)


def placed(worker_id: str) -> int:
    return _placed.get(worker_id, 0)


class Overloaded(Exception):
    """The pool is saturated and the request may not (low) or no longer (timeout) wait."""

    def __init__(self, message: str, *, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


@dataclass(frozen=True, slots=True)
class Slot:
    worker_id: str
    token: str = ""  # "": the worker has no capacity, nothing is held
    waited_s: float = 0.0

    def release(self) -> None:
        _unplace(self.worker_id)
        if self.token and not _hand_over(self.worker_id, self.token):
            _table().release(self.worker_id, self.token)


def _hand_over(worker_id: str, token: str) -> bool:
    """Give a freed slot straight to this process's next waiter that can use it (its lease just changes
    hands: no Redis round trip, and no other process can take it in between); False when none waits."""
    try:
        state = _loops.get(asyncio.get_running_loop())
    except RuntimeError:
        return False
    if state is None:
        return False
    for model_id, queue in state.queues.items():
        if state.contested.get(model_id):
            # Another process has requests waiting for this model too: the slot goes back to Redis and
            # every process's head asks on an equal footing (its next poll), or this process would keep
            # the slot for its own queue for as long as it has one.
            continue
        waiter = queue.head()
        while waiter is not None and waiter.future.done():
            queue.pop_head()
            waiter = queue.head()
        if waiter is None or not any(w == worker_id and cap is not None for w, cap in waiter.candidates):
            continue
        # The head's turn, on the worker it prefers (its prefix holder) if this is it; else the next waiter
        # of the same priority, in turn, that prefers this worker takes the slot (the head gets the next
        # one freed on its own worker, soon: a prefix miss would cost it a cold prefill); none: the head.
        if waiter.candidates[0][0] != worker_id:
            waiter = queue.preferring(waiter.priority, worker_id) or waiter
        queue.take(waiter)
        waiter.future.set_result(token)
        return True
    return False


# Candidate workers in preference order, each with its capacity (None: unlimited).
Candidates = Sequence[tuple[str, int | None]]


class _LocalSlots:
    """One process's slots (the embedded profile): exact, no I/O."""

    def __init__(self) -> None:
        self.held: dict[str, int] = {}

    async def acquire(self, candidates: Candidates) -> str | None:
        for worker_id, cap in candidates:
            if cap is not None and self.held.get(worker_id, 0) < cap:
                self.held[worker_id] = self.held.get(worker_id, 0) + 1
                return worker_id
        return None

    def release(self, worker_id: str, token: str) -> None:
        count = self.held.get(worker_id, 0) - 1
        if count > 0:
            self.held[worker_id] = count
        else:
            self.held.pop(worker_id, None)
        _wake()

    def counts(self) -> dict[str, int]:
        return dict(self.held)


# KEYS: the workers' slot sets, in preference order; ARGV: token, lease ms, then each worker's capacity.
# Returns the 1-based index of the worker a slot was taken on, or 0 when all are full.
_ACQUIRE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
for i, key in ipairs(KEYS) do
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
  if redis.call('ZCARD', key) < tonumber(ARGV[i + 2]) then
    redis.call('ZADD', key, now + tonumber(ARGV[2]), ARGV[1])
    redis.call('PEXPIRE', key, tonumber(ARGV[2]) * 2)
    return i
  end
end
return 0
"""
# KEYS: the model's waiting hash; ARGV: this process, "1" while it has waiters ("0": it has none now).
# Returns 1 when another process has said within the last 500 ms that it has waiters for the model.
_WAITING = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if ARGV[2] == '1' then
  redis.call('HSET', KEYS[1], ARGV[1], now + 500)
  redis.call('PEXPIRE', KEYS[1], 2000)
else
  redis.call('HDEL', KEYS[1], ARGV[1])
end
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  if all[i] ~= ARGV[1] and tonumber(all[i + 1]) > now then
    return 1
  end
end
return 0
"""
# KEYS: slot sets; ARGV: lease ms, then one token per key: extend each lease still held.
_RENEW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
for i, key in ipairs(KEYS) do
  redis.call('ZADD', key, 'XX', now + tonumber(ARGV[1]), ARGV[i + 1])
  redis.call('PEXPIRE', key, tonumber(ARGV[1]) * 2)
end
return 1
"""


class _RedisSlots:
    """Slots shared by every gateway process through Redis (leased, so a dead process's come back)."""

    def __init__(self, url: str) -> None:
        import redis.asyncio as aioredis

        self.client = aioredis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=2)
        self.acquire_script = self.client.register_script(_ACQUIRE)
        self.renew_script = self.client.register_script(_RENEW)
        self.waiting_script = self.client.register_script(_WAITING)
        self.mine: dict[str, str] = {}  # token -> worker id: this process's held slots
        self.local: dict[str, int] = {}
        self.renewer: asyncio.Task[None] | None = None

    @staticmethod
    def key(worker_id: str) -> str:
        return f"si:slots:{connection.settings_dict['NAME']}:w:{worker_id}"

    async def acquire(self, candidates: Candidates) -> str | None:
        capped = [(w, c) for w, c in candidates if c is not None]
        if not capped:
            return None
        token = f"{fleet.PROCESS}:{next(_tokens)}"
        index = await self.acquire_script(
            keys=[self.key(w) for w, _ in capped], args=[token, int(LEASE_S * 1000), *[c for _, c in capped]]
        )
        if not index:
            return None
        worker_id = capped[int(index) - 1][0]
        self.mine[token] = worker_id
        self.local[worker_id] = self.local.get(worker_id, 0) + 1
        if self.renewer is None or self.renewer.done():
            self.renewer = asyncio.get_running_loop().create_task(self._renew_forever())
        return f"{worker_id}\x00{token}"

    def release(self, worker_id: str, token: str) -> None:
        token = token.partition("\x00")[2]
        self.mine.pop(token, None)
        count = self.local.get(worker_id, 0) - 1
        if count > 0:
            self.local[worker_id] = count
        else:
            self.local.pop(worker_id, None)
        # No instant wake of this process's waiters: a slot _hand_over did not keep is for whichever
        # process's head asks first, each on its next poll.
        try:
            task = asyncio.get_running_loop().create_task(self._free(worker_id, token))
        except RuntimeError:
            return  # no loop (a shutdown): the lease runs out within LEASE_S
        task.add_done_callback(_quiet)

    async def note_waiting(self, model_id: str, *, waiting: bool) -> bool:
        """Say whether this process has waiters for the model; whether another process has."""
        key = f"si:waiting:{connection.settings_dict['NAME']}:{model_id}"
        return bool(await self.waiting_script(keys=[key], args=[fleet.PROCESS, "1" if waiting else "0"]))

    async def _free(self, worker_id: str, token: str) -> None:
        await self.client.zrem(self.key(worker_id), token)

    async def _renew_forever(self) -> None:
        while self.mine:
            await asyncio.sleep(LEASE_S / 3)
            held = list(self.mine.items())
            if not held:
                return
            try:
                await self.renew_script(
                    keys=[self.key(w) for _, w in held], args=[int(LEASE_S * 1000), *[t for t, _ in held]]
                )
            except Exception as exc:  # a Redis blip: the lease has room for the next try
                log.warning("could not renew capacity leases (%s)", type(exc).__name__)

    def counts(self) -> dict[str, int]:
        return dict(self.local)


def _quiet(task: asyncio.Task[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.warning("could not free a capacity slot (%s); its lease runs out", type(task.exception()).__name__)


@dataclass(slots=True)
class _Waiter:
    account: object
    priority: str
    candidates: Candidates
    future: asyncio.Future[str]
    since: float = field(default_factory=time.monotonic)


class _ModelQueue:
    """One model's waiters in this process: by priority, and within one, the accounts in turn."""

    def __init__(self) -> None:
        self.levels: dict[str, OrderedDict[object, deque[_Waiter]]] = {p: OrderedDict() for p in PRIORITIES}
        self.size = 0

    def push(self, waiter: _Waiter) -> None:
        self.levels[waiter.priority].setdefault(waiter.account, deque()).append(waiter)
        self.size += 1

    def head(self) -> _Waiter | None:
        for level in self.levels.values():
            for waiters in level.values():
                return waiters[0]
        return None

    def pop_head(self) -> None:
        for level in self.levels.values():
            for account, waiters in level.items():
                waiters.popleft()
                self.size -= 1
                # The account goes to the back of its priority's turn, or leaves it when it has no more.
                if waiters:
                    level.move_to_end(account)
                else:
                    del level[account]
                return

    def preferring(self, priority: str, worker_id: str, *, scan: int = 64) -> _Waiter | None:
        """The first waiter of `priority`, in the accounts' turn, whose first choice is `worker_id`."""
        for i, waiters in enumerate(self.levels[priority].values()):
            if i >= scan:
                return None
            for waiter in itertools.islice(waiters, 4):
                if not waiter.future.done() and waiter.candidates[0][0] == worker_id:
                    return waiter
        return None

    def take(self, waiter: _Waiter) -> None:
        """Serve `waiter`: out of the queue, and its account to the back of its priority's turn."""
        level = self.levels[waiter.priority]
        waiters = level[waiter.account]
        waiters.remove(waiter)
        self.size -= 1
        if waiters:
            level.move_to_end(waiter.account)
        else:
            del level[waiter.account]

    def remove(self, waiter: _Waiter) -> None:
        waiters = self.levels[waiter.priority].get(waiter.account)
        if waiters is not None and waiter in waiters:
            waiters.remove(waiter)
            self.size -= 1
            if not waiters:
                del self.levels[waiter.priority][waiter.account]

    def waiting(self, priority: str) -> int:
        return sum(len(w) for w in self.levels[priority].values())


@dataclass(slots=True)
class _LoopState:
    queues: dict[str, _ModelQueue] = field(default_factory=dict)
    dispatchers: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    contested: dict[str, bool] = field(default_factory=dict)  # model -> another process has waiters too
    freed: asyncio.Event = field(default_factory=asyncio.Event)


_local_table: list[_LocalSlots] = []
_tables: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _RedisSlots] = weakref.WeakKeyDictionary()
_loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopState] = weakref.WeakKeyDictionary()
# Process-wide figures for /metrics: (model, priority) -> [requests that waited, seconds waited in all].
_waited: dict[tuple[str, str], list[float]] = {}
_refused: dict[tuple[str, str], int] = {}


def _table() -> _LocalSlots | _RedisSlots:
    # One table per event loop under Redis (its client is bound to the loop it was made on), one per
    # process in memory.
    if not settings.REDIS_URL:
        if not _local_table:
            _local_table.append(_LocalSlots())
        return _local_table[0]
    loop = asyncio.get_running_loop()
    table = _tables.get(loop)
    if table is None:
        table = _tables[loop] = _RedisSlots(settings.REDIS_URL)
    return table


def _state() -> _LoopState:
    loop = asyncio.get_running_loop()
    state = _loops.get(loop)
    if state is None:
        state = _loops[loop] = _LoopState()
    return state


def _wake() -> None:
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return
    state = _loops.get(loop)
    if state is not None:
        state.freed.set()


def _slot_of(granted: str, *, waited_s: float) -> Slot:
    if "\x00" in granted:  # the Redis table's token carries its worker
        return Slot(worker_id=granted.partition("\x00")[0], token=granted, waited_s=waited_s)
    return Slot(worker_id=granted, token=granted, waited_s=waited_s)


async def admit(*, model_id: str, candidates: Candidates, account: object, priority: str) -> Slot:
    """A slot on the first candidate with room (a worker without a capacity needs none), waiting in
    this process's queue for the model while the pool is saturated; Overloaded when it may not wait
    (low) or waited SPEEDINFER_QUEUE_TIMEOUT."""
    slot = await _admit(model_id=model_id, candidates=candidates, account=account, priority=priority)
    _place(slot.worker_id)
    return slot


async def _admit(*, model_id: str, candidates: Candidates, account: object, priority: str) -> Slot:
    # In preference order: the capped workers before the first uncapped one are asked for a slot; failing
    # those, the uncapped one takes the request (it never saturates, so the pool is not saturated).
    ungated = next((i for i, (_, cap) in enumerate(candidates) if cap is None), None)
    if ungated is not None:
        preferred = candidates[:ungated]
        granted = await _try(preferred) if preferred else None
        return _slot_of(granted, waited_s=0.0) if granted else Slot(worker_id=candidates[ungated][0])
    state = _state()
    queue = state.queues.get(model_id)
    if queue is None or not queue.size:
        try:
            granted = await _table().acquire(candidates)
        except (RedisError, OSError) as exc:
            # Redis unreachable: the request goes on ungated (the runtime's own queue absorbs any excess)
            # rather than failing; the rate limits make the same choice (docs/operations.md).
            global _warned_at
            if time.monotonic() - _warned_at > 60:
                _warned_at = time.monotonic()
                log.warning("capacity slots unavailable (%s); requests are not gated", type(exc).__name__)
            return Slot(worker_id=candidates[0][0])
        if granted is not None:
            return _slot_of(granted, waited_s=0.0)
    if priority == "low":
        _refused[(model_id, priority)] = _refused.get((model_id, priority), 0) + 1
        raise Overloaded(f"every worker of the model '{model_id}' is at capacity; retry later", retry_after=1)
    # Read again: other requests may have made the queue while this one asked Redis.
    queue = state.queues.get(model_id)
    if queue is None:
        queue = state.queues[model_id] = _ModelQueue()
    waiter = _Waiter(account, priority, candidates, asyncio.get_running_loop().create_future())
    queue.push(waiter)
    task = state.dispatchers.get(model_id)
    if task is None or task.done():
        state.dispatchers[model_id] = asyncio.get_running_loop().create_task(_dispatch(model_id, queue, state))
    timeout = settings.SPEEDINFER_QUEUE_TIMEOUT
    try:
        granted = await asyncio.wait_for(asyncio.shield(waiter.future), timeout)
    except TimeoutError:
        queue.remove(waiter)
        if waiter.future.done() and not waiter.future.cancelled():
            _slot_of(waiter.future.result(), waited_s=0).release()  # granted as the wait ran out
        else:
            waiter.future.cancel()
        _refused[(model_id, priority)] = _refused.get((model_id, priority), 0) + 1
        _note_wait(model_id, priority, time.monotonic() - waiter.since)
        raise Overloaded(
            f"every worker of the model '{model_id}' stayed at capacity for {timeout:g} s; retry later",
            retry_after=max(1, round(timeout / 10)),
        ) from None
    except asyncio.CancelledError:
        # The client left while waiting: a slot granted meanwhile goes back at once.
        queue.remove(waiter)
        if waiter.future.done() and not waiter.future.cancelled():
            _slot_of(waiter.future.result(), waited_s=0).release()
        else:
            waiter.future.cancel()
        raise
    waited = time.monotonic() - waiter.since
    _note_wait(model_id, priority, waited)
    return _slot_of(granted, waited_s=waited)


async def _try(candidates: Candidates) -> str | None:
    """A slot on one of `candidates` without waiting; None when all are full or Redis is unreachable."""
    try:
        return await _table().acquire(candidates)
    except (RedisError, OSError):
        return None


def _note_wait(model_id: str, priority: str, waited: float) -> None:
    figures = _waited.setdefault((model_id, priority), [0.0, 0.0])
    figures[0] += 1
    figures[1] += waited


async def _dispatch(model_id: str, queue: _ModelQueue, state: _LoopState) -> None:
    """Hand freed slots to this process's waiters for the model, the head first, until none wait."""
    try:
        await _dispatch_loop(model_id, queue, state)
    finally:
        state.contested.pop(model_id, None)
        table = _table()
        if isinstance(table, _RedisSlots):
            try:
                await table.note_waiting(model_id, waiting=False)
            except (RedisError, OSError):
                pass  # its mark runs out within 500 ms


async def _dispatch_loop(model_id: str, queue: _ModelQueue, state: _LoopState) -> None:
    while True:
        waiter = queue.head()
        if waiter is None:
            return
        if waiter.future.done():
            queue.pop_head()
            continue
        table = _table()
        try:
            if isinstance(table, _RedisSlots):
                state.contested[model_id] = await table.note_waiting(model_id, waiting=True)
            granted = await table.acquire(waiter.candidates)
        except Exception as exc:  # Redis unreachable: the waiters time out rather than overfill a GPU
            log.warning("capacity slot request failed (%s)", type(exc).__name__)
            granted = None
        if granted is not None:
            if queue.head() is waiter and not waiter.future.done():
                queue.pop_head()
                waiter.future.set_result(granted)
            else:
                _slot_of(granted, waited_s=0).release()
            continue
        state.freed.clear()
        try:
            await asyncio.wait_for(state.freed.wait(), POLL_S)
        except TimeoutError:
            pass


def queue_lengths() -> dict[tuple[str, str], int]:
    """(model, priority) -> requests waiting in this process (all its event loops)."""
    lengths: dict[tuple[str, str], int] = {}
    for state in list(_loops.values()):
        for model_id, queue in state.queues.items():
            for priority in PRIORITIES[:2]:
                lengths[(model_id, priority)] = lengths.get((model_id, priority), 0) + queue.waiting(priority)
    return lengths


def wait_totals() -> dict[tuple[str, str], tuple[int, float]]:
    """(model, priority) -> (requests that waited, seconds they waited in all)."""
    return {k: (int(v[0]), v[1]) for k, v in _waited.items()}


def refusals() -> dict[tuple[str, str], int]:
    """(model, priority) -> 503 overloaded answers (low refused, or the wait ran out)."""
    return dict(_refused)


def held() -> dict[str, int]:
    """Slots this process holds per worker."""
    totals: dict[str, int] = {}
    tables: list[_LocalSlots | _RedisSlots] = [*_local_table, *list(_tables.values())]
    for table in tables:
        for worker_id, count in table.counts().items():
            totals[worker_id] = totals.get(worker_id, 0) + count
    return totals


def reset() -> None:
    """Forget every slot, waiter and figure (tests)."""
    _local_table.clear()
    _tables.clear()
    _placed.clear()
    _waited.clear()
    _refused.clear()


process_state.register("workers.queue", reset)
