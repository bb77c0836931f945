"""The staff REST API (/api/workers/) and the admin take the same registration JSON as the command."""

from __future__ import annotations

import json

import pytest

from tests.factories import make_account, make_key, make_model
from tests.test_workers_registration import SPEC_CUDA, SPEC_EXAMPLES, SPEC_TRITON
from workers.models import Worker

pytestmark = pytest.mark.django_db
PASSWORD = "a-long-test-password-1"


@pytest.fixture(autouse=True)
def _model() -> None:
    make_model(model_id="acme/model-1")


def post(client, doc, **headers):
    body = doc if isinstance(doc, str) else json.dumps(doc)
    return client.post("/api/workers/", body, content_type="application/json", **headers)


def test_the_four_spec_examples_register_through_the_api_and_come_back_the_same(staff):
    for text, transport in SPEC_EXAMPLES.values():
        response = post(staff, text)
        assert response.status_code == 201, response.content
        body = response.json()
        sent = json.loads(text)
        for key, value in sent.items():
            assert body[key] == value
        assert body["transport"] == transport
    assert post(staff, SPEC_TRITON).status_code == 200  # idempotent: updated, not duplicated
    listed = staff.get("/api/workers/").json()["data"]
    assert [w["worker_id"] for w in listed] == sorted(SPEC_EXAMPLES)
    # What GET returns can be PUT back unchanged.
    doc = staff.get("/api/workers/triton-01/").json()
    response = staff.put("/api/workers/triton-01/", json.dumps(doc), content_type="application/json")
    assert response.status_code == 200
    assert staff.delete("/api/workers/triton-01/").status_code == 204
    assert staff.get("/api/workers/triton-01/").status_code == 404


def test_bad_registration_is_a_400_naming_the_field(staff):
    doc = json.loads(SPEC_TRITON)
    del doc["runtime_config"]["max_tokens_input_name"]
    response = post(staff, doc)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "runtime_config.max_tokens_input_name"
    assert "runtime_config.max_tokens_input_name" in error["message"]
    assert not Worker.objects.exists()


def test_the_upstream_key_is_write_only(staff):
    doc = json.loads(SPEC_CUDA) | {"upstream_api_key": "sk-upstream-secret"}
    response = post(staff, doc)
    assert response.status_code == 201
    assert "sk-upstream-secret" not in response.content.decode()
    assert response.json()["has_upstream_api_key"] is True
    for url in ("/api/workers/", "/api/workers/cuda-01/"):
        assert "sk-upstream-secret" not in staff.get(url).content.decode()
    assert Worker.objects.get().upstream_api_key == "sk-upstream-secret"


def test_only_staff_or_an_admin_key_may_use_it(client, django_user_model):
    assert client.get("/api/workers/").status_code == 401
    assert post(client, SPEC_CUDA).status_code == 401
    django_user_model.objects.create_user(username="customer", password=PASSWORD)
    client.login(username="customer", password=PASSWORD)
    assert client.get("/api/workers/").status_code == 403
    client.logout()
    account = make_account()
    plain = make_key(account=account).secret
    admin = make_key(account=account, scopes=["admin"]).secret
    assert client.get("/api/workers/", HTTP_AUTHORIZATION=f"Bearer {plain}").status_code == 403
    assert post(client, SPEC_CUDA, HTTP_AUTHORIZATION=f"Bearer {admin}").status_code == 201
    assert client.get("/api/workers/", HTTP_AUTHORIZATION=f"Bearer {admin}").status_code == 200


def test_the_admin_registers_the_spec_examples_and_validates_the_same_way(admin_client):
    for worker_id, (text, _) in SPEC_EXAMPLES.items():
        response = admin_client.post("/admin/workers/worker/add/", {"registration": text})
        assert response.status_code == 302, response.content.decode()[:2000]
        assert Worker.objects.filter(worker_id=worker_id).exists()
    bad = json.loads(SPEC_CUDA) | {"worker_id": "cuda-02", "gpu_metadata": {"serial_number": "1234"}}
    response = admin_client.post("/admin/workers/worker/add/", {"registration": json.dumps(bad)})
    assert response.status_code == 200
    assert "gpu_metadata.serial_number" in response.content.decode()
    assert not Worker.objects.filter(worker_id="cuda-02").exists()


def test_the_admin_shows_health_and_metadata_but_never_the_upstream_key(admin_client):
    doc = json.loads(SPEC_CUDA) | {"upstream_api_key": "sk-hidden-in-admin"}
    admin_client.post("/admin/workers/worker/add/", {"registration": json.dumps(doc)})
    worker = Worker.objects.get(worker_id="cuda-01")
    assert worker.upstream_api_key == "sk-hidden-in-admin"
    listing = admin_client.get("/admin/workers/worker/").content.decode()
    assert "cuda-01" in listing and "sk-hidden-in-admin" not in listing
    page = admin_client.get(f"/admin/workers/worker/{worker.pk}/change/").content.decode()
    assert "operator-reported" in page  # GPU and runtime metadata shown to staff
    assert "sk-hidden-in-admin" not in page
    # Saving the form again without typing the key keeps it.
    registration = json.dumps(json.loads(SPEC_CUDA))
    response = admin_client.post(f"/admin/workers/worker/{worker.pk}/change/", {"registration": registration})
    assert response.status_code == 302
    assert Worker.objects.get(pk=worker.pk).upstream_api_key == "sk-hidden-in-admin"


def test_admin_actions_disable_enable_reset_and_probe(admin_client):
    admin_client.post("/admin/workers/worker/add/", {"registration": SPEC_CUDA})
    worker = Worker.objects.get()
    Worker.objects.update(circuit_state="open", consecutive_failures=5)

    def act(action):
        return admin_client.post(
            "/admin/workers/worker/", {"action": action, "_selected_action": [worker.pk]}, follow=True
        )

    act("disable")
    assert Worker.objects.get().enabled is False
    act("enable")
    assert Worker.objects.get().enabled is True
    act("reset_circuit")
    assert Worker.objects.get().circuit_state == "closed"
    page = act("probe_now").content.decode()
    assert "uda-01: unhealthy (upstream_error" in page  # http://cuda-worker:8000 does not resolve here
    assert Worker.objects.get().last_probe_at is not None


def test_staff_changes_to_workers_are_audited_with_who_and_never_the_key(admin_client, staff):
    from core.models import AuditLog

    doc = json.loads(SPEC_CUDA) | {"upstream_api_key": "sk-never-in-the-audit"}
    admin_client.post("/admin/workers/worker/add/", {"registration": json.dumps(doc)})
    worker = Worker.objects.get()
    admin_client.post("/admin/workers/worker/", {"action": "disable", "_selected_action": [worker.pk]})
    admin_client.post("/admin/workers/worker/", {"action": "reset_circuit", "_selected_action": [worker.pk]})
    changed = json.loads(SPEC_CUDA)
    changed["runtime_config"] = {**changed["runtime_config"], "read_timeout": 30}
    assert post(staff, json.dumps(changed)).status_code == 200
    # The same registration again (what a worker agent sends every interval) is no change: no row.
    assert post(staff, json.dumps(changed)).status_code == 200
    assert staff.delete("/api/workers/cuda-01/").status_code == 204
    rows = list(AuditLog.objects.order_by("id").values_list("actor", "action", "target_repr"))
    actions = [(actor, action) for actor, action, _ in rows]
    assert actions == [
        ("admin", "worker.register"),
        ("admin", "worker.disable"),
        ("admin", "worker.circuit_reset"),
        ("ops", "worker.update"),
        ("ops", "worker.delete"),
    ]
    assert all(target == "cuda-01" for _, _, target in rows)
    assert "sk-never-in-the-audit" not in json.dumps(list(AuditLog.objects.values_list("detail", flat=True)))
