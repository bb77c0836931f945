"""The audit trail of staff changes: one append-only row per change, written in the change's transaction."""

from __future__ import annotations

from typing import Any

from django.db.models import Model

from core.models import AuditLog


def actor_name(actor: object) -> str:
    if actor is None:
        return ""
    if isinstance(actor, str):
        return actor
    username = getattr(actor, "username", None) or getattr(actor, "get_username", lambda: "")()
    return str(username or actor)[:150]


def audit_record(*, actor: object, action: str, target: object, detail: dict[str, Any] | None = None) -> AuditLog:
    """Append an audit row for a staff change (keys, credits, workers, prices).

    `actor` is a user, an API-key principal or a plain string; `target` a model
    instance or a string. Call it inside the change's transaction where there is one.
    Never put a secret in `detail`.
    """
    if isinstance(target, Model):
        target_type = target._meta.label_lower
        target_id = str(target.pk)
    else:
        target_type, target_id = "", ""
    return AuditLog.objects.create(
        actor=actor_name(actor),
        action=action,
        target_type=target_type,
        target_id=target_id,
        target_repr=str(target)[:300],
        detail=detail or {},
    )
