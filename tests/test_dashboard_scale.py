"""The dashboard's queries on a million usage records (PostgreSQL only).

One account in twenty owns a quarter of the rows (250,000 over 90 days): the
heavy customer whose pages must stay fast. Timings are printed (`-s`) and
asserted with generous bounds for a busy 2-core CI machine.
"""

from __future__ import annotations

import contextlib
import time
from datetime import timedelta

import pytest
from django.db import DatabaseError, connection
from django.test import Client
from django.utils import timezone

from accounts.services import account_user_create
from billing.models import UsageRecord
from console.dashboard.selectors import dashboard_summary, usage_by_day_and_model, usage_records
from tests.factories import make_account

ROWS = 1_000_000
PASSWORD = "correct horse battery staple"

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def timed(label: str, fn, timings: dict[str, float]):
    started = time.perf_counter()
    result = fn()
    timings[label] = (time.perf_counter() - started) * 1000
    return result


def test_dashboard_queries_on_a_million_records():
    if connection.vendor != "postgresql":
        pytest.skip("the scale test needs PostgreSQL")
    heavy = make_account(name="Heavy")
    others = [make_account(name=f"other-{i}").pk for i in range(19)]
    account_user_create(account=heavy, email="heavy@example.com", password=PASSWORD)
    timings: dict[str, float] = {}

    def generate() -> None:
        t0 = time.perf_counter()
        with connection.cursor() as cursor:
            # Skips the per-row foreign-key triggers for this bulk load (the ids are known good).
            with contextlib.suppress(DatabaseError):  # needs a superuser; merely slower without
                cursor.execute("SET session_replication_role = replica")
            cursor.execute(
                """
                INSERT INTO billing_usagerecord (
                    account_id, request_id, endpoint, model_id, worker_id, prompt_tokens, completion_tokens,
                    cost, reserved, overrun, latency_ms, streamed, status, error_code, created_at)
                SELECT
                    CASE WHEN g %% 4 = 0 THEN %s ELSE (%s::bigint[])[1 + g %% 19] END,
                    '', 'chat', 'acme/model-' || (g %% 5), 'gpu-' || (g %% 8),
                    100 + g %% 900, 10 + g %% 500, 1000 + g %% 5000, 20000, 0, 50 + g %% 2000, g %% 3 = 0,
                    CASE WHEN g %% 50 = 0 THEN 'failed' ELSE 'ok' END, '',
                    now() - (g * 7.6) * interval '1 second'
                FROM generate_series(1, %s) AS g
                """,
                [heavy.pk, others, ROWS],
            )
            cursor.execute("SET session_replication_role = DEFAULT")
            timings["insert"] = (time.perf_counter() - t0) * 1000
            cursor.execute("VACUUM ANALYZE billing_usagerecord")

    timed("generate 1M rows + vacuum analyze", generate, timings)
    assert UsageRecord.objects.filter(account=heavy).count() == ROWS // 4

    today = timezone.localdate()
    summary = timed("summary (balance, month spend, today)", lambda: dashboard_summary(account=heavy), timings)
    assert summary.requests_today > 0
    rows_30 = timed(
        "per day x model, 30 days",
        lambda: usage_by_day_and_model(account=heavy, start=today - timedelta(days=29), end=today),
        timings,
    )
    assert len({r.model_id for r in rows_30}) == 5 and 29 <= len({r.day for r in rows_30}) <= 31
    rows_90 = timed(
        "per day x model, 90 days",
        lambda: usage_by_day_and_model(account=heavy, start=today - timedelta(days=89), end=today),
        timings,
    )
    assert sum(r.requests for r in rows_90) == ROWS // 4
    timed("recent 50 rows", lambda: list(usage_records(account=heavy)[:50]), timings)

    client = Client()
    assert client.login(username="heavy@example.com", password=PASSWORD)
    home = timed("GET /dashboard/ (whole page)", lambda: client.get("/dashboard/"), timings)
    usage = timed("GET /dashboard/usage/ (30 days, whole page)", lambda: client.get("/dashboard/usage/"), timings)
    start = (today - timedelta(days=89)).isoformat()
    wide = timed("GET /dashboard/usage/ (90 days)", lambda: client.get(f"/dashboard/usage/?start={start}"), timings)
    assert home.status_code == usage.status_code == wide.status_code == 200

    with connection.cursor() as cursor:
        cursor.execute(
            "EXPLAIN SELECT date(created_at), model_id, count(*), sum(cost) FROM billing_usagerecord"
            " WHERE account_id = %s AND created_at >= now() - interval '30 days' GROUP BY 1, 2",
            [heavy.pk],
        )
        plan = "\n".join(row[0] for row in cursor.fetchall())

    print("\n" + "\n".join(f"  {label:48s} {ms:9.1f} ms" for label, ms in timings.items()))
    print(plan)
    assert "usage_account_day_cover" in plan
    assert timings["per day x model, 90 days"] < 3000
    assert timings["GET /dashboard/usage/ (30 days, whole page)"] < 3000
    assert timings["summary (balance, month spend, today)"] < 1500
