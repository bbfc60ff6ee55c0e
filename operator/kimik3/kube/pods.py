"""What a pod's labels and status mean, for pods as plain dicts (the API's JSON) or as the
``kubernetes`` client's models (``V1Pod``). Used by the controller, status, autoscaler, dev
cluster and engine simulator alike."""

from __future__ import annotations

from typing import Any

from kimik3.kube.labels import LWS_WORKER_INDEX_LABEL


def _get(obj: Any, key: str, attr: str | None = None) -> Any:
    if obj is None:
        return None
    if isinstance(obj, dict):
        return obj.get(key)
    return getattr(obj, attr or key, None)


def labels(pod: Any) -> dict[str, str]:
    return _get(_get(pod, "metadata"), "labels") or {}


def is_leader(pod: Any) -> bool:
    """The group's rank 0 (LeaderWorkerSet worker index 0): the pod that serves the API."""
    return labels(pod).get(LWS_WORKER_INDEX_LABEL) == "0"


def role(pod: Any) -> str:
    """``"leader"`` or ``"worker"``."""
    return "leader" if is_leader(pod) else "worker"


def is_terminating(pod: Any) -> bool:
    """Deletion requested (``metadata.deletionTimestamp`` set)."""
    return _get(_get(pod, "metadata"), "deletionTimestamp", "deletion_timestamp") is not None


def _conditions(pod: Any) -> list[Any]:
    return _get(_get(pod, "status"), "conditions") or []


def condition(pod: Any, type_: str) -> Any:
    """The pod condition of this type, or None."""
    return next((c for c in _conditions(pod) if _get(c, "type") == type_), None)


def is_ready(pod: Any) -> bool:
    """Condition ``Ready`` is ``True`` and the pod is not terminating."""
    c = condition(pod, "Ready")
    return c is not None and _get(c, "status") == "True" and not is_terminating(pod)


def is_unschedulable(pod: Any) -> bool:
    """The scheduler found no node: ``PodScheduled=False`` with reason ``Unschedulable``."""
    c = condition(pod, "PodScheduled")
    return c is not None and _get(c, "status") == "False" and _get(c, "reason") == "Unschedulable"


def unschedulable_message(pod: Any) -> str:
    """The scheduler's message for an unschedulable pod ("" otherwise)."""
    c = condition(pod, "PodScheduled")
    return (_get(c, "message") or "") if is_unschedulable(pod) else ""
