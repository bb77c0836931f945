"""The embedded demo's workers (see `manage.py seeddemo` and `manage.py rundemo`)."""

from __future__ import annotations


def seed_workers() -> None:
    """Register demo workers pointing at the bundled worker simulator."""
