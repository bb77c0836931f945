"""Shared fixtures (pytest plugin, registered in tests/conftest.py): the personas and the gateway's world.

Personas, as in healthchecks' hc/test.py:
- `staff`: a Client signed in as "ops", a staff user without superuser rights (what the staff API needs);
- `admin_client` (pytest-django's own): a Client signed in as the superuser "admin" (what /admin/ needs).

`make_world(...)` builds what a gateway test starts from: a priced model, a customer account with
credits and a key, a worker that serves the model, and the running gateway. `world` is its default.
The objects come from tests/factories.py, the one home of factories.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import openai
import pytest
from django.test import Client

from tests.factories import make_account, make_key, make_model
from tests.servers import register_worker

PASSWORD = "correct horse battery staple"
World = dict[str, Any]
TRITON_FIXTURES = frozenset({"triton_server", "triton_factory"})


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that starts the real Triton server and forgot its `triton` mark gets it, so `-m "not triton"`
    leaves them all out."""
    for item in items:
        if TRITON_FIXTURES & set(getattr(item, "fixturenames", ())) and item.get_closest_marker("triton") is None:
            item.add_marker(pytest.mark.triton)


@pytest.fixture
def staff(django_user_model: Any) -> Client:
    user = django_user_model.objects.create_user(username="ops", password=PASSWORD, is_staff=True)
    client = Client()
    client.force_login(user)
    return client


def sdk(world: World, *, secret: str | None = None, **kwargs: Any) -> openai.OpenAI:
    """The official openai SDK against the world's gateway, with the world's key unless `secret` is given."""
    return openai.OpenAI(base_url=world["url"] + "/v1", api_key=secret or world["secret"], max_retries=0, **kwargs)


@pytest.fixture
def make_world(request: pytest.FixtureRequest) -> Callable[..., World]:
    """make_world(account=..., credits=..., key=..., model=..., worker=..., triton=..., gateway=...) -> dict.

    - model: make_model's arguments for the simulator's model (None: no such model);
    - worker: "simulator" registers the session's simulator for it, another string that base URL, None none;
    - triton: {public model id: Triton model name}, each registered as a worker of the real Triton server
      with `triton_config` (its tensor names), its model priced at the defaults;
    - gateway: False for a test that starts its own gateways (no "url", no "ai").
    The dict holds account, key (the ApiKey), secret, and where they apply url, ai (an SDK client),
    simulator and triton (the servers).
    """

    def make(
        *,
        account: str = "customer",
        credits: int = 10,
        key: Mapping[str, Any] | None = None,
        model: Mapping[str, Any] | None = None,
        worker: str | None = "simulator",
        triton: Mapping[str, str] | None = None,
        triton_config: Mapping[str, Any] | None = None,
        gateway: bool = True,
    ) -> World:
        url = request.getfixturevalue("gateway_server").url if gateway else None  # up before the rows, as before
        if model is not None or not triton:
            make_model(**{"model_id": "acme/model-1", "max_output_tokens": 64, **(model or {})})
        owner = make_account(name=account, credits=credits)
        created = make_key(account=owner, **(key or {}))
        world: World = {"account": owner, "key": created.api_key, "secret": created.secret}
        if worker == "simulator":
            simulator = request.getfixturevalue("simulator")
            register_worker(simulator.base_url)
            world["simulator"] = simulator
        elif worker is not None:
            register_worker(worker)
        if triton:
            server = request.getfixturevalue("triton_server")
            for model_id, triton_model in triton.items():
                make_model(model_id=model_id, max_output_tokens=32)
                register_worker(
                    server.url,
                    worker_id=f"triton-{triton_model}",
                    runtime="triton",
                    models=(model_id,),
                    model_name=triton_model,
                    **(triton_config or {}),
                )
            world["triton"] = server
        if url is not None:
            world["url"] = url
            world["ai"] = sdk(world)
        return world

    return make


@pytest.fixture
def world(make_world: Callable[..., World]) -> World:
    """The default world: acme/model-1 (1 and 2 credits per 1M tokens) on the simulator, 10 credits, one key."""
    return make_world()
