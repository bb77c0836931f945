"""Settlements the database could not take when the request ended, retried until it can, and kept on disk
so that they outlive the process (docs/operations.md, "The close journal").

A request whose worker answered is settled with the worker's usage; one that failed is released.
When the database is unreachable at that moment (cut between reserve and settle), the close is kept
here and retried every RETRY_INTERVAL seconds, so the hold is settled or released as soon as the
database is back instead of waiting for the reservation sweep. A retry is safe: a settle or release
only claims a reservation still held (a settle also one the sweep expired: delivered content is
never free), so one that did commit before its answer was lost is a no-op the second time.

The journal: before the answer goes out, a queued close is appended to this process's file under
SPEEDINFER_VAR_DIR/journal (one JSON line, fsync'd), and a `done` line follows once it is written.
The process holds an exclusive flock on its file while it lives; the kernel drops it when the process
dies, however it dies (SIGKILL included). A gateway process starting up (and again on its first /v1
request, for servers without the ASGI lifespan) takes over every journal nobody holds: it queues
their closes that have no `done` line (journalled again in its own file first) and deletes them.
Replay is idempotent by reservation id, as a retry is. Nothing touches the disk while the database
answers: the hot path is unchanged.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from django.conf import settings

from core import state
from core.metrics import observe_queued_close
from core.outages import DatabaseUnavailable

log = logging.getLogger("speedinfer.gateway")

RETRY_INTERVAL = 1.0
Close = Callable[[], Awaitable[object]]


@dataclass(slots=True)
class _Pending:
    what: str  # "settle" or "release", for the log
    reservation_id: object
    close: Close
    journalled: bool = False


_queues: state.LoopLocal[list[_Pending]] = state.LoopLocal("proxy.pending.queues")
_drains: state.LoopLocal[asyncio.Task[None]] = state.LoopLocal("proxy.pending.drains", close=state.cancel)


def pending_count() -> int:
    """Closes waiting for the database in this process (all loops)."""
    return sum(len(queue) for queue in _queues.values())


def pending_close(*, what: str, reservation_id: object, close: Close, entry: dict[str, Any] | None = None) -> None:
    """Keep `close` (a settle or release of `reservation_id`) and retry it until the database takes it.

    With `entry` (what it takes to make the same close again in another process: JSON), the close is
    journalled on disk first, so it survives this process."""
    journalled = False
    if entry is not None:
        journalled = _journal.append({"op": "close", **entry, "reservation_id": str(reservation_id)})
    queue = _queues.get()
    if queue is None:
        queue = _queues.set([])
    queue.append(_Pending(what, reservation_id, close, journalled))
    observe_queued_close(1)
    log.warning("reservation %s: the database is unreachable; the %s is queued and retried", reservation_id, what)
    drain = _drains.get()
    if drain is None or drain.done():
        _drains.set(asyncio.get_running_loop().create_task(_drain(queue)))


async def _drain(queue: list[_Pending]) -> None:
    while queue:
        await asyncio.sleep(RETRY_INTERVAL)
        for item in list(queue):
            try:
                await item.close()
            except DatabaseUnavailable:
                break  # still down: the rest would fail the same way
            except Exception:
                log.exception(
                    "reservation %s: the queued %s failed; the sweep releases it", item.reservation_id, item.what
                )
            else:
                log.info("reservation %s: the queued %s was written", item.reservation_id, item.what)
            queue.remove(item)
            observe_queued_close(-1)
            if item.journalled:
                _journal.append({"op": "done", "reservation_id": str(item.reservation_id)})
        if not queue:
            _journal.compact_if_idle()


class _Journal:
    """This process's journal file, opened (and locked) at its first queued close."""

    def __init__(self) -> None:
        self.fd: int | None = None
        self.path: Path | None = None
        self.open_closes = 0  # journalled closes without their done line

    @staticmethod
    def directory() -> Path:
        return Path(settings.VAR_DIR) / "journal"

    def _open(self) -> int:
        if self.fd is None:
            directory = self.directory()
            directory.mkdir(parents=True, exist_ok=True)
            self.path = directory / f"closes-{os.getpid()}-{uuid.uuid4().hex[:8]}.jsonl"
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a new file: nobody else holds it
            # The new name must survive a power cut too, not only the lines written to it.
            directory_fd = os.open(directory, os.O_RDONLY)
            try:
                os.fsync(directory_fd)
            finally:
                os.close(directory_fd)
            self.fd = fd
        return self.fd

    def append(self, record: dict[str, Any]) -> bool:
        """Append one line and fsync it (only while the database is unreachable: a few per cut).
        False when the disk refused it: the close is still queued in memory, as before the journal."""
        try:
            fd = self._open()
            os.write(fd, orjson.dumps(record) + b"\n")
            os.fsync(fd)
        except OSError:
            log.exception("the close journal could not be written; the close is kept in memory only")
            return False
        self.open_closes += 1 if record["op"] == "close" else -1
        return True

    def compact_if_idle(self) -> None:
        """Every journalled close is written: the file can start over empty."""
        if self.fd is not None and self.open_closes <= 0:
            try:
                os.ftruncate(self.fd, 0)
                os.fsync(self.fd)
                self.open_closes = 0
            except OSError:
                log.warning("the close journal could not be emptied", exc_info=True)


_journal = _Journal()


def _orphans() -> list[tuple[Path, int]]:
    """Journal files whose process is gone (nobody holds their lock), each opened and locked by us."""
    directory = _Journal.directory()
    if not directory.is_dir():
        return []
    found = []
    for path in sorted(directory.glob("closes-*.jsonl")):
        if path == _journal.path:
            continue
        try:
            fd = os.open(path, os.O_RDWR)
        except FileNotFoundError:  # another process took it over meanwhile
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # its process is alive and keeps it
            os.close(fd)
            continue
        if not path.exists():  # taken over and deleted between our open and our lock
            os.close(fd)
            continue
        found.append((path, fd))
    return found


def _unfinished(fd: int) -> list[dict[str, Any]]:
    data = b""
    while chunk := os.read(fd, 1 << 20):
        data += chunk
    closes: dict[str, dict[str, Any]] = {}
    for line in data.splitlines():
        try:
            record = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue  # a line torn by the crash: its close was never acknowledged, its answer never sent
        if not isinstance(record, dict) or not isinstance(record.get("reservation_id"), str):
            continue
        if record.get("op") == "close":
            closes[record["reservation_id"]] = record
        elif record.get("op") == "done":
            closes.pop(record["reservation_id"], None)
    return list(closes.values())


_replay_started = False


def claim_replay() -> bool:
    """True the first time in this process: the caller replays the orphaned journals."""
    global _replay_started
    first, _replay_started = not _replay_started, True
    return first


async def replay_orphans(*, make_close: Callable[[dict[str, Any]], Close]) -> int:
    """Take over the journals of dead processes: write (or queue) each close they had not written.
    Returns how many closes were taken over."""
    taken = 0
    for path, fd in await asyncio.to_thread(_orphans):
        try:
            entries = _unfinished(fd)
            for entry in entries:
                close = make_close(entry)
                try:
                    await close()
                except DatabaseUnavailable:
                    pending_close(
                        what=str(entry.get("what")), reservation_id=entry["reservation_id"], close=close, entry=entry
                    )
                except Exception:
                    log.exception("reservation %s: the journalled close failed", entry["reservation_id"])
                else:
                    log.info("reservation %s: the journalled %s was written", entry["reservation_id"], entry["what"])
            taken += len(entries)
            # Deleted only now: each close is written or journalled again in this process's own file.
            path.unlink(missing_ok=True)
        finally:
            os.close(fd)
    if taken:
        log.warning("took over %d close(s) journalled by a gateway process that died", taken)
    return taken


def reset() -> None:
    """Tests: forget this process's queues and journal file."""
    global _journal, _replay_started
    _queues.clear()
    _drains.clear()
    if _journal.fd is not None:
        os.close(_journal.fd)
    _journal = _Journal()
    _replay_started = False


state.register("proxy.pending.journal", reset)
