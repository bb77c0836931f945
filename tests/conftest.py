from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from accounts import key_cache

# The real Triton server fixtures (triton_server, triton_factory), for the workers and proxy tests.
pytest_plugins = ["tests.triton_server", "tests.servers"]


class _QuietAbandonedLoops(logging.Filter):
    """Tests run async code in short-lived loops (asyncio.run, async_to_sync) that end without the ASGI
    lifespan shutdown that closes the upstream client in a server; aiohttp then reports the pooled
    session as unclosed when it is collected, often after pytest has closed the log stream."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(("Unclosed client session", "Unclosed connector"))


logging.getLogger("asyncio").addFilter(_QuietAbandonedLoops())


@pytest.fixture(autouse=True)
def _fresh_key_cache() -> Iterator[None]:
    key_cache.clear()
    yield
    key_cache.clear()


@pytest.fixture(autouse=True)
def _fresh_scheduler() -> Iterator[None]:
    """The prefix index and the capacity slots are per process: no test inherits another's."""
    from workers import prefix, queue

    prefix.reset()
    queue.reset()
    yield
    prefix.reset()
    queue.reset()


@pytest.fixture
def subprocess_env(transactional_db: None) -> dict[str, str]:
    """Environment for a child process (manage.py, a server) that uses this test's database."""
    import os

    from django.db import connection

    db = connection.settings_dict
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if db["ENGINE"].endswith("sqlite3"):
        env["DATABASE_URL"] = f"sqlite:///{db['NAME']}"
    elif db["ENGINE"].endswith("postgresql"):
        user = db.get("USER") or "postgres"
        host = db.get("HOST") or "127.0.0.1"
        port = db.get("PORT") or 5432
        env["DATABASE_URL"] = f"postgres://{user}@{host}:{port}/{db['NAME']}"
    return env
