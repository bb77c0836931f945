"""Schemathesis fuzzes /v1 and /api/ against their OpenAPI documents: no 5xx, no answer off the document.

Bounded (FUZZ_EXAMPLES per operation) so it stays well under a minute in `make test`; raise
SPEEDINFER_FUZZ_EXAMPLES for a longer run.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error, response_schema_conformance

from accounts.services import api_key_create
from console.pages import v1_document
from tests.factories import make_account, make_model
from tests.servers import register_worker

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("fresh_gateway"), pytest.mark.slow]
FUZZ_EXAMPLES = int(os.environ.get("SPEEDINFER_FUZZ_EXAMPLES", "25"))
CHECKS = [not_a_server_error, response_schema_conformance]


def _fuzz(schema: Any, *, base_url: str, headers: dict[str, str]) -> list[str]:
    """Run every operation's generated cases; answer the failures as one line each."""
    failures: list[str] = []
    for result in schema.get_all_operations():
        operation = result.ok()

        @given(case=operation.as_strategy())
        @settings(
            max_examples=FUZZ_EXAMPLES,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
            derandomize=True,
        )
        def run(case: Any) -> None:
            case.call_and_validate(base_url=base_url, headers=headers, checks=CHECKS, timeout=20)

        try:
            run()
        except (Exception, BaseExceptionGroup) as exc:  # a check's failure (or a group), named by operation
            failures.append(f"{operation.label}: {str(exc).strip().splitlines()[0]}")
    return failures


def test_fuzz_v1(gateway_server, simulator):
    make_model(model_id="acme/model-1", max_output_tokens=16)
    account = make_account(name="fuzz", credits=1000)
    secret = api_key_create(account=account, monthly_budget=500_000_000).secret
    register_worker(simulator.base_url)
    schema = schemathesis.openapi.from_dict(v1_document())
    failures = _fuzz(schema, base_url=gateway_server.url, headers={"Authorization": f"Bearer {secret}"})
    assert failures == []


def test_fuzz_staff_api(gateway_server):
    from drf_spectacular.generators import SchemaGenerator

    make_model(model_id="acme/model-1")
    make_account(name="fuzzed", credits=5)
    admin = api_key_create(account=make_account(name="ops"), scopes=["admin"]).secret
    document = SchemaGenerator().get_schema(request=None, public=True)
    # Registering a worker probes its endpoint: fuzzed URLs would only test the network's timeouts.
    schema = schemathesis.openapi.from_dict(document).exclude(
        path_regex="^/api/workers/", method=["POST", "PUT", "PATCH"]
    )
    failures = _fuzz(schema, base_url=gateway_server.url, headers={"Authorization": f"Bearer {admin}"})
    assert failures == []
