"""The close journal (proxy/pending.py; docs/operations.md, "The close journal"): a dead gateway process's
queued closes are written by the next one, exactly once per reservation id, on either database.

The SIGKILL during a real database cut is in tests/test_outages.py; these take over journal files as a
crash leaves them (a close written before the crash, a close already done, a torn last line, a file
whose process is still alive).
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import Any

import orjson
import pytest

from billing.models import Reservation, UsageRecord
from billing.services import credits_reserve, reservation_settle
from core.credits import MICRO
from proxy.billed import replay_journal
from tests.factories import make_account, make_model, money

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.sqlite]


def _close(reservation: Reservation, *, what: str = "settle", **fields: Any) -> bytes:
    outcome = {"request_id": "r-1", "endpoint": "/v1/chat/completions", "worker_id": "sim-1", "latency": 0.5}
    record = {"op": "close", "what": what, "reservation_id": str(reservation.pk), "outcome": outcome, **fields}
    return orjson.dumps(record) + b"\n"


def _done(reservation: Reservation) -> bytes:
    return orjson.dumps({"op": "done", "reservation_id": str(reservation.pk)}) + b"\n"


@pytest.fixture
def journal_dir(settings: Any, tmp_path: Path) -> Path:
    settings.VAR_DIR = tmp_path
    directory = tmp_path / "journal"
    directory.mkdir()
    return directory


def test_a_dead_process_journal_is_written_once_per_reservation(gateway_server, journal_dir):
    model = make_model(model_id="acme/model-1")
    account = make_account(credits=10)
    before = money(account)
    pending, committed, done, released = (
        credits_reserve(account_id=account.pk, amount=MICRO, model=model, request_id=f"r-{i}") for i in range(4)
    )
    # Written before the crash, its done line lost with the process: replaying it must charge nothing more.
    first = reservation_settle(reservation_id=committed.pk, prompt_tokens=3, completion_tokens=4)
    assert first is not None
    settle: dict[str, Any] = {"prompt_tokens": 10, "completion_tokens": 20, "status": "ok"}
    (journal_dir / "closes-999999-dead.jsonl").write_bytes(
        _close(pending, **settle)
        + _close(committed, **settle)
        + _close(done, **settle)
        + _done(done)
        + _close(released, what="release", error_code="upstream_error")
        + b'{"op": "close", "what": "settle", "reserv'  # torn by the crash
    )

    assert gateway_server.run_on_loop(replay_journal()) == 3
    assert list(journal_dir.iterdir()) == []  # taken over and deleted
    assert Reservation.objects.get(pk=pending.pk).status == "settled"
    record = UsageRecord.objects.get(reservation_id=pending.pk)
    assert (record.prompt_tokens, record.completion_tokens, record.worker_id) == (10, 20, "sim-1")
    assert record.cost == 10 * 1 + 20 * 2  # make_model's prices: 1 and 2 micro-credits per token
    assert UsageRecord.objects.get(reservation_id=committed.pk).cost == first.cost == 3 + 2 * 4
    assert Reservation.objects.get(pk=done.pk).status == "held"  # done in its journal: not replayed
    assert Reservation.objects.get(pk=released.pk).status == "released"
    assert money(account) == (before[0] - record.cost - first.cost - MICRO, MICRO)  # `done`'s hold remains

    # Replaying again (another process starting) finds nothing to do.
    assert gateway_server.run_on_loop(replay_journal()) == 0
    assert UsageRecord.objects.count() == 3
    assert money(account) == (before[0] - record.cost - first.cost - MICRO, MICRO)


def test_a_live_process_journal_is_left_to_it(gateway_server, journal_dir):
    model = make_model(model_id="acme/model-1")
    account = make_account(credits=10)
    held = credits_reserve(account_id=account.pk, amount=MICRO, model=model, request_id="r-live")
    path = journal_dir / "closes-1-alive.jsonl"
    path.write_bytes(_close(held, prompt_tokens=1, completion_tokens=1, status="ok"))
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # its process holds it while it lives
        assert gateway_server.run_on_loop(replay_journal()) == 0
        assert path.exists() and Reservation.objects.get(pk=held.pk).status == "held"
    finally:
        os.close(fd)  # the process died: the kernel drops the lock
    assert gateway_server.run_on_loop(replay_journal()) == 1
    assert Reservation.objects.get(pk=held.pk).status == "settled"
    assert not path.exists()
