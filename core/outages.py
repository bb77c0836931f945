"""Losing a dependency (PostgreSQL, Redis): one exception per dependency, which the gateway answers
with docs/interface.md's 503 service_unavailable, never a hang and never a 500.

`DatabaseUnavailable` is what every database call of the /v1 path raises when the database cannot be
reached (a refused or timed-out connection, a pool that hands out none in time, a connection that broke
mid-statement): core.db.db_call translates Django's errors, billing.ledger.postgresql psycopg's and the pool's.
"""

from __future__ import annotations

import django.db
import psycopg
from psycopg_pool import PoolTimeout

# What an unreachable database looks like from each client. Only connection-level errors: an
# IntegrityError or a ProgrammingError is a bug, and stays a 500 with its traceback in the log.
DJANGO_DB_ERRORS: tuple[type[Exception], ...] = (django.db.OperationalError, django.db.InterfaceError)
PSYCOPG_DB_ERRORS: tuple[type[Exception], ...] = (psycopg.OperationalError, psycopg.InterfaceError, PoolTimeout)
DB_ERRORS = DJANGO_DB_ERRORS + PSYCOPG_DB_ERRORS


class DatabaseUnavailable(Exception):
    """The database could not be reached in time; nothing was written (or, for a settle, not yet)."""


class RedisUnavailable(Exception):
    """Redis could not be reached in time and this deployment requires it (SPEEDINFER_REDIS_OUTAGE=fail)."""
