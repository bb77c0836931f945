"""The Grafana dashboard (docs/grafana/speedinfer.json) and the Prometheus alert rules (docs/prometheus/alerts.yml)
name only metrics that a running gateway's /metrics serves."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.fixtures import sdk
from tests.servers import register_worker, stream_events

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("fresh_gateway")]

DOCS = Path(__file__).resolve().parent.parent / "docs"
METRIC = re.compile(r"\bspeedinfer_[a-z_]+")


def dashboard_exprs() -> list[str]:
    dashboard = json.loads((DOCS / "grafana" / "speedinfer.json").read_text())
    return [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]


def rule_exprs() -> list[str]:
    # The rules file is YAML; its expressions are the `expr:` lines (no YAML library in the project).
    text = (DOCS / "prometheus" / "alerts.yml").read_text()
    return [line.split("expr:", 1)[1].strip() for line in text.splitlines() if line.strip().startswith("expr:")]


def served_names(text: str) -> set[str]:
    return {sample.name for family in text_string_to_metric_families(text) for sample in family.samples}


def test_the_dashboard_and_the_alert_rules_name_only_metrics_that_exist(make_world, simulator):
    world = make_world(worker=None)
    ai = sdk(world)
    base = world["url"]
    # metrics_url: the probe reads the runtime's queue, so speedinfer_worker_runtime_queue has a series.
    register_worker(simulator.base_url, metrics_url=simulator.base_url.removesuffix("/v1") + "/metrics")

    hello: Any = [{"role": "user", "content": "hello"}]
    usage = ai.chat.completions.create(model="acme/model-1", messages=hello).usage
    assert usage is not None and usage.completion_tokens > 0
    streamed = {"model": "acme/model-1", "stream": True, "messages": hello}
    assert stream_events(base, "/v1/chat/completions", world["secret"], streamed)
    # A worker reporting far more than the account can pay: the uncharged overrun series appears.
    greedy: Any = [{"role": "user", "content": "[sim usage=100000000,100000000]"}]
    ai.chat.completions.create(model="acme/model-1", messages=greedy)

    response = httpx.get(base + "/metrics", timeout=10)
    assert response.status_code == 200
    served = served_names(response.text)

    exprs = dashboard_exprs() + rule_exprs()
    assert len(dashboard_exprs()) >= 10 and len(rule_exprs()) >= 5
    named = {name for expr in exprs for name in METRIC.findall(expr)}
    # A histogram is named by its series (_bucket, _sum, _count), a counter by its _total.
    assert named and named <= served, sorted(named - served)
    for wanted in (
        'speedinfer_worker_circuit_state{state="open"}',
        "speedinfer_settles_queued",
        "speedinfer_uncharged_overrun_credits_total",
        "speedinfer_worker_runtime_queue",
    ):
        assert any(wanted in expr for expr in rule_exprs()), wanted
