from __future__ import annotations

from collections.abc import Iterator

import pytest

from accounts import key_cache

# The real Triton server fixtures (triton_server, triton_factory), for the workers and proxy tests.
pytest_plugins = ["tests.triton_server", "tests.servers"]


@pytest.fixture(autouse=True)
def _fresh_key_cache() -> Iterator[None]:
    key_cache.clear()
    yield
    key_cache.clear()


@pytest.fixture
def subprocess_env(transactional_db: None) -> dict[str, str]:
    """Environment for a child process (manage.py, a server) that uses this test's database."""
    import os

    from django.db import connection

    db = connection.settings_dict
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if db["ENGINE"].endswith("postgresql"):
        user = db.get("USER") or "postgres"
        host = db.get("HOST") or "127.0.0.1"
        port = db.get("PORT") or 5432
        env["DATABASE_URL"] = f"postgres://{user}@{host}:{port}/{db['NAME']}"
    return env
