"""Per-key rate limits: requests per minute and tokens per minute, as token buckets.

Each limit is a bucket holding at most the per-minute allowance and refilling
continuously at allowance/60 per second, so a key can burst up to its minute's
allowance and is then held to the steady rate (no doubled burst at a window
boundary, as fixed windows allow).

A request costs one request and its token bound (prompt bound + max_tokens).
It is admitted when the bucket holds that much; a request larger than the
whole allowance is admitted once the bucket is full and leaves it in debt.
After the answer the unused part of the token bound is given back, so the
tokens limit ends up counting the worker's actual usage. With Redis the give-back
rides on the key's next admit (one round trip a request instead of two), or goes
on its own within REFUND_FLUSH_S when no request of that key comes first; until it
lands the bucket counts more than was used, never less.

With REDIS_URL, one Lua script per check reads and updates both buckets
atomically on the Redis clock, so the limit holds across every gateway
process; without it, the same arithmetic runs in this process. When Redis cannot be
reached, SPEEDINFER_REDIS_OUTAGE says what happens: `local` (the default) falls back
to this process's buckets, `fail` answers 503 service_unavailable.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from dataclasses import dataclass
from typing import Any

import redis.exceptions
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from accounts.key_cache import KeyInfo
from core import state
from core.outages import RedisUnavailable

log = logging.getLogger("speedinfer.gateway")

# Redis did not answer in time or refused the connection (redis-py's own errors, and the OS's).
_REDIS_ERRORS = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError, TimeoutError)

_WINDOW_MS = 60_000

_ADMIT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local rpm, tpm, cost, back = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4] or '0')
local function level(key, cap)
  local v = redis.call('HMGET', key, 'l', 't')
  local l, ts = tonumber(v[1]), tonumber(v[2])
  if l == nil then return cap end
  return math.min(cap, l + (now - ts) * cap / 60000)
end
local function store(key, l, cap)
  redis.call('HSET', key, 'l', tostring(l), 't', now)
  redis.call('PEXPIRE', key, math.ceil((cap - l) * 60000 / cap) + 1000)
end
local rl, tl, wait = 0, 0, 0
if rpm > 0 then
  rl = level(KEYS[1], rpm)
  if rl < 1 then wait = math.max(wait, math.ceil((1 - rl) * 60000 / rpm)) end
end
if tpm > 0 then
  tl = level(KEYS[2], tpm)
  -- The unused bound of the key's earlier requests, given back before this one is judged.
  if back > 0 and redis.call('EXISTS', KEYS[2]) == 1 then tl = math.min(tpm, tl + back) end
  local need = math.min(cost, tpm)
  if tl < need then wait = math.max(wait, math.ceil((need - tl) * 60000 / tpm)) end
end
if wait > 0 then
  if back > 0 and tpm > 0 and redis.call('EXISTS', KEYS[2]) == 1 then store(KEYS[2], tl, tpm) end
  return {0, wait, math.floor(rl), math.floor(tl)}
end
if rpm > 0 then rl = rl - 1; store(KEYS[1], rl, rpm) end
if tpm > 0 then tl = tl - cost; store(KEYS[2], tl, tpm) end
return {1, 0, math.floor(rl), math.floor(tl)}
"""

_REFUND = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local cap, back = tonumber(ARGV[1]), tonumber(ARGV[2])
local v = redis.call('HMGET', KEYS[1], 'l', 't')
local l, ts = tonumber(v[1]), tonumber(v[2])
if l == nil then return 0 end
l = math.min(cap, l + (now - ts) * cap / 60000 + back)
redis.call('HSET', KEYS[1], 'l', tostring(l), 't', now)
redis.call('PEXPIRE', KEYS[1], math.ceil((cap - l) * 60000 / cap) + 1000)
return 1
"""


@dataclass(frozen=True, slots=True)
class RateLimitConfig:
    redis_url: str  # "" : this process's buckets only (the embedded default)
    redis_timeout: float  # seconds, connect and each command
    redis_outage: str  # "local": fall back to this process's buckets; "fail": 503

    def __post_init__(self) -> None:
        if self.redis_outage not in ("local", "fail"):
            raise ImproperlyConfigured(f"SPEEDINFER_REDIS_OUTAGE must be local or fail, got {self.redis_outage!r}")
        if self.redis_timeout <= 0:
            raise ImproperlyConfigured(f"SPEEDINFER_REDIS_TIMEOUT must be positive, got {self.redis_timeout!r}")

    @classmethod
    def from_settings(cls) -> RateLimitConfig:
        return cls(
            redis_url=settings.REDIS_URL,
            redis_timeout=settings.SPEEDINFER_REDIS_TIMEOUT,
            redis_outage=settings.SPEEDINFER_REDIS_OUTAGE,
        )


_config = state.Lazy("proxy.ratelimit.config", RateLimitConfig.from_settings)
get_rate_limit_config = _config.get


@dataclass(frozen=True, slots=True)
class Decision:
    allowed: bool
    retry_after_ms: int
    remaining_requests: int
    remaining_tokens: int

    def headers(self, key: KeyInfo) -> list[tuple[bytes, bytes]]:
        """OpenAI's x-ratelimit-* headers (reset: time until the bucket is full again)."""
        out: list[tuple[bytes, bytes]] = []
        if key.rpm:
            remaining = max(0, self.remaining_requests)
            out += [
                (b"x-ratelimit-limit-requests", str(key.rpm).encode()),
                (b"x-ratelimit-remaining-requests", str(remaining).encode()),
                (b"x-ratelimit-reset-requests", _duration((key.rpm - remaining) * 60 / key.rpm)),
            ]
        if key.tpm:
            remaining = max(0, self.remaining_tokens)
            out += [
                (b"x-ratelimit-limit-tokens", str(key.tpm).encode()),
                (b"x-ratelimit-remaining-tokens", str(remaining).encode()),
                (b"x-ratelimit-reset-tokens", _duration((key.tpm - self.remaining_tokens) * 60 / key.tpm)),
            ]
        if not self.allowed:
            out += [
                (b"retry-after", str(max(1, math.ceil(self.retry_after_ms / 1000))).encode()),
                (b"retry-after-ms", str(self.retry_after_ms).encode()),
            ]
        return out


def _duration(seconds: float) -> bytes:
    if seconds < 60:
        return f"{max(0.0, seconds):.3g}s".encode()
    return f"{int(seconds // 60)}m{int(seconds % 60)}s".encode()


UNLIMITED = Decision(allowed=True, retry_after_ms=0, remaining_requests=0, remaining_tokens=0)


def _bucket_names(key: KeyInfo) -> tuple[str, str]:
    # The digest, not the row id: ids repeat across databases sharing one Redis.
    tag = key.digest[:20]
    return f"si:rl:{{{tag}}}:r", f"si:rl:{{{tag}}}:t"


class _LocalBuckets:
    """The embedded default: the same buckets in this process's memory."""

    def __init__(self) -> None:
        self._levels: dict[str, tuple[float, float]] = {}

    def _level(self, name: str, cap: int, now: float) -> float:
        entry = self._levels.get(name)
        if entry is None:
            return float(cap)
        level, at = entry
        return min(float(cap), level + (now - at) * cap / 60.0)

    def admit(self, key: KeyInfo, tokens: int) -> Decision:
        now = time.monotonic()
        r_name, t_name = _bucket_names(key)
        rl = tl = 0.0
        wait = 0.0
        if key.rpm:
            rl = self._level(r_name, key.rpm, now)
            if rl < 1:
                wait = max(wait, (1 - rl) * 60 / key.rpm)
        if key.tpm:
            tl = self._level(t_name, key.tpm, now)
            need = min(tokens, key.tpm)
            if tl < need:
                wait = max(wait, (need - tl) * 60 / key.tpm)
        if wait > 0:
            return Decision(False, math.ceil(wait * 1000), math.floor(rl), math.floor(tl))
        if len(self._levels) > 100_000:
            self._levels.clear()
        if key.rpm:
            rl -= 1
            self._levels[r_name] = (rl, now)
        if key.tpm:
            tl -= tokens
            self._levels[t_name] = (tl, now)
        return Decision(True, 0, math.floor(rl), math.floor(tl))

    def refund(self, key: KeyInfo, tokens: int) -> None:
        assert key.tpm
        now = time.monotonic()
        _, t_name = _bucket_names(key)
        if t_name in self._levels:
            self._levels[t_name] = (min(float(key.tpm), self._level(t_name, key.tpm, now) + tokens), now)


_local = _LocalBuckets()
# Per loop: the Redis client (closed on reset) and its two registered scripts.
_scripts: state.LoopLocal[tuple[Any, object, object]] = state.LoopLocal(
    "proxy.ratelimit.redis", close=lambda found: found[0].aclose()
)


def _reset() -> None:
    global _local, _outage
    _local = _LocalBuckets()
    _outage = False


state.register("proxy.ratelimit.local", _reset)


def _redis_scripts() -> tuple[object, object]:
    """The Redis client's two registered scripts for the running event loop."""
    import redis.asyncio as aioredis

    found = _scripts.get()
    if found is None:
        config = get_rate_limit_config()
        timeout = config.redis_timeout
        # redis-py's pool holds 100 connections and raises past them: a burst of arrivals would read as a
        # Redis outage and fall back to per-process limits. A blocking pool queues them (each admit is one
        # short round trip), and only a wait past the timeout is an outage.
        pool = aioredis.BlockingConnectionPool.from_url(
            config.redis_url,
            max_connections=100,
            timeout=timeout,
            socket_connect_timeout=timeout,
            socket_timeout=timeout,
        )
        client = aioredis.Redis.from_pool(pool)
        found = _scripts.set((client, client.register_script(_ADMIT), client.register_script(_REFUND)))
    return found[1], found[2]


def _redis_down(exc: Exception) -> None:
    """Redis did not answer: with SPEEDINFER_REDIS_OUTAGE=fail the request gets 503, else this
    process's own buckets stand in (each process then limits on its own) until Redis answers again."""
    global _outage
    if get_rate_limit_config().redis_outage == "fail":
        raise RedisUnavailable(str(exc) or type(exc).__name__) from exc
    if not _outage:
        _outage = True
        log.warning("Redis is unreachable (%s): rate limits fall back to this process's limiter", type(exc).__name__)


def _redis_up() -> None:
    global _outage
    if _outage:
        _outage = False
        log.warning("Redis is reachable again: rate limits are shared across processes again")


_outage = False  # logged once per outage, not once per request


async def rate_limit_admit(*, key: KeyInfo, tokens: int) -> Decision:
    """Charge one request and `tokens` to the key's buckets, or say how long to wait; the key's refunds
    not yet sent go with it."""
    if not key.rpm and not key.tpm:
        return UNLIMITED
    if not get_rate_limit_config().redis_url:
        return _local.admit(key, tokens)
    admit, _ = _redis_scripts()
    names = _bucket_names(key)
    pending = _pending.get()
    back = pending.pop(names[1], (key, 0))[1] if pending else 0
    try:
        allowed, wait, rl, tl = await admit(keys=list(names), args=[key.rpm or 0, key.tpm or 0, tokens, back])  # type: ignore[operator]
    except _REDIS_ERRORS as exc:
        _redis_down(exc)
        if back:
            _local.refund(key, back)
        return _local.admit(key, tokens)
    _redis_up()
    return Decision(bool(allowed), int(wait), int(rl), int(tl))


async def rate_limit_refund(*, key: KeyInfo, tokens: int) -> None:
    """Give back tokens admitted but not used (the bound minus the actual usage)."""
    if not key.tpm or tokens <= 0:
        return
    if not get_rate_limit_config().redis_url:
        _local.refund(key, tokens)
        return
    _, refund = _redis_scripts()
    try:
        await refund(keys=[_bucket_names(key)[1]], args=[key.tpm, tokens])  # type: ignore[operator]
    except _REDIS_ERRORS:
        # Never fails the request (its answer is out); the local buckets took the admit, if any.
        _local.refund(key, tokens)


_refunds: set[asyncio.Task[None]] = set()  # strong refs until done (the loop keeps only weak ones)
REFUND_FLUSH_S = 0.05
# Per loop: per tpm bucket name, its key and the tokens to give back not yet sent (the key's next admit
# takes them).
_pending: state.LoopLocal[dict[str, tuple[KeyInfo, int]]] = state.LoopLocal("proxy.ratelimit.pending")


def rate_limit_refund_soon(*, key: KeyInfo, tokens: int) -> None:
    """rate_limit_refund off the response path: the answer has gone out, and neither its handler nor the
    next request on its connection waits for a Redis round trip. With Redis the tokens ride on the key's
    next admit, or are sent within REFUND_FLUSH_S when none comes first. The limit stays exact across
    processes: until the refund lands the bucket only counts more than was used, never less."""
    if not key.tpm or tokens <= 0:
        return
    if not get_rate_limit_config().redis_url:
        _local.refund(key, tokens)  # this process's buckets: no round trip to save
        return
    pending = _pending.get() or _pending.set({})
    name = _bucket_names(key)[1]
    first = not pending
    pending[name] = (key, pending.get(name, (key, 0))[1] + tokens)
    if first:
        asyncio.get_running_loop().call_later(REFUND_FLUSH_S, _flush_refunds)


def _flush_refunds() -> None:
    """Send the refunds no admit took since they were queued (one round trip each, concurrently)."""
    pending = _pending.get()
    if not pending:
        return
    due = list(pending.values())
    pending.clear()
    for key, tokens in due:
        task = asyncio.get_running_loop().create_task(rate_limit_refund(key=key, tokens=tokens))
        _refunds.add(task)
        task.add_done_callback(_refunds.discard)
