from __future__ import annotations

from speedinfer.celery import app as celery_app

__all__ = ["celery_app"]
