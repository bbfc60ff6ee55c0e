"""Reading any object's metadata and ``status.conditions`` (a pod's, a node's, a custom
resource's), whether the object is the API's JSON (a dict with camelCase keys) or a
``kubernetes`` client model (``V1Pod``, ``V1Node``: snake_case attributes)."""

from __future__ import annotations

from typing import Any


def field(obj: Any, key: str, attr: str | None = None) -> Any:
    """``obj[key]`` of a dict, else the attribute ``attr`` (default ``key``) of a client model;
    None when ``obj`` is None or has no such field."""
    if obj is None:
        return None
    if isinstance(obj, dict):
        return obj.get(key)
    return getattr(obj, attr or key, None)


def is_deleting(obj: Any) -> bool:
    """Deletion requested: ``metadata.deletionTimestamp`` is set (finalizers or a grace period
    may keep the object a while)."""
    return bool(field(field(obj, "metadata"), "deletionTimestamp", "deletion_timestamp"))


def condition(obj: Any, type_: str) -> Any:
    """The condition of ``type_`` in ``obj.status.conditions`` (a dict or a client model), or None."""
    return next((c for c in field(field(obj, "status"), "conditions") or [] if field(c, "type") == type_), None)


def is_true(obj: Any, type_: str) -> bool:
    """Condition ``type_`` is present with status ``"True"``."""
    status: object = field(condition(obj, type_), "status")
    return status == "True"
