"""Process state: every cache, estimate, queue, client and pool a module keeps for this process.

Each module registers its state here with a reset function, so one `reset()` (tests, before and
after each one) returns the whole process to its start. State bound to an event loop (clients,
pools, background tasks) lives in a `LoopLocal`, the one per-loop idiom: keyed by the loop object
itself, weakly, because an `id()` is reused by a later loop and a client bound to a closed loop must
never be handed out.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

T = TypeVar("T")

_resets: dict[str, Callable[[], None]] = {}
_configs: list[Lazy[object]] = []


def register(name: str, reset: Callable[[], None]) -> None:
    """`reset` returns `name`'s state to the process's start (registering a name again replaces it)."""
    _resets[name] = reset


def registered() -> list[str]:
    return sorted(_resets)


def reset() -> None:
    """Every registered state back to its start; open resources are closed where their loop can run."""
    for fn in list(_resets.values()):
        fn()


def reset_config() -> None:
    """Only the config objects (rebuilt from settings on next use): a test changed a setting."""
    for config in list(_configs):
        config.clear()


async def cancel(task: asyncio.Future[Any]) -> None:
    """A LoopLocal `close` for background tasks: cancelled, and waited for (its `finally` runs)."""
    task.cancel()
    with contextlib.suppress(BaseException):
        await task


def _close_on(loop: asyncio.AbstractEventLoop, close: Callable[[T], Awaitable[object] | None], value: T) -> None:
    async def wait(awaitable: Awaitable[object]) -> None:
        await awaitable

    awaitable = close(value)
    if awaitable is None:
        return
    try:
        loop.run_until_complete(wait(awaitable))
    except RuntimeError:
        pass  # the loop started or closed meanwhile: dropping the reference is all that is left


class LoopLocal(Generic[T]):
    """One value per event loop (a client, a pool, a background task), registered under `name`.

    On reset, `close` (if given) releases the value of an open, idle loop on that loop; a closed
    loop's value is dropped (its sockets and tasks went with it); a running loop keeps its own."""

    def __init__(self, name: str, *, close: Callable[[T], Awaitable[object] | None] | None = None) -> None:
        self._values: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, T] = weakref.WeakKeyDictionary()
        self._close = close
        register(name, self.clear)

    def get(self, loop: asyncio.AbstractEventLoop | None = None) -> T | None:
        return self._values.get(loop or asyncio.get_running_loop())

    def set(self, value: T, loop: asyncio.AbstractEventLoop | None = None) -> T:
        # A value (a client's open connection) usually refers to its loop, which then outlives its
        # close in the weak mapping: drop closed loops' values here (a set is rare: one per loop).
        for closed in [known for known in self._values if known.is_closed()]:
            del self._values[closed]
        self._values[loop or asyncio.get_running_loop()] = value
        return value

    def pop(self, loop: asyncio.AbstractEventLoop | None = None) -> T | None:
        return self._values.pop(loop or asyncio.get_running_loop(), None)

    def values(self) -> list[T]:
        return list(self._values.values())

    def clear(self) -> None:
        for loop, value in list(self._values.items()):
            if loop.is_running():
                # A live server's loop (another thread's): its clients, pools and tasks are its own, hold
                # no request's state, and are closed by its shutdown; closing them under it races its calls.
                continue
            del self._values[loop]
            if self._close is not None and not loop.is_closed():
                _close_on(loop, self._close, value)


class Lazy(Generic[T]):
    """A config object built from settings once (at start-up, or on first use), rebuilt after a reset
    or a changed setting; reading it touches no setting."""

    def __init__(self, name: str, build: Callable[[], T]) -> None:
        self._build = build
        self._value: T | None = None
        register(name, self.clear)
        _configs.append(self)  # type: ignore[arg-type]

    def get(self) -> T:
        value = self._value
        if value is None:
            value = self._value = self._build()
        return value

    def set(self, value: T) -> None:
        self._value = value

    def clear(self) -> None:
        self._value = None
