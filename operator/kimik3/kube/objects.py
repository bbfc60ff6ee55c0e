"""One shape for every Kubernetes object the core reads: the API's JSON decoded into plain dicts
(camelCase keys), as kopf hands bodies to its handlers and ``controller.kube.Kube`` returns them.
Helpers take a read-only ``Mapping``, so kopf's ``Body`` views pass as well as dicts; they read an
object's metadata and ``status.conditions`` whatever its kind (a pod's, a node's, a custom
resource's).

The ``kubernetes`` package's models (``V1Pod``, ``V1Node``) are not objects here: code holding one
converts it where it got it (``ApiClient().sanitize_for_serialization(model)``), or asks the API
for JSON in the first place.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeAlias, TypedDict, cast

Object: TypeAlias = Mapping[str, Any]
"""Any object as the API serves it: ``apiVersion``, ``kind``, ``metadata``, ``spec``, ``status``."""


class Meta(TypedDict, total=False):
    """``metadata`` (the fields the operator reads; the API sends more)."""

    name: str
    namespace: str
    uid: str
    generation: int
    resourceVersion: str
    labels: dict[str, str]
    annotations: dict[str, str]
    ownerReferences: list[dict[str, Any]]
    creationTimestamp: str
    deletionTimestamp: str


class Condition(TypedDict, total=False):
    """One entry of ``status.conditions`` (metav1.Condition and the core kinds' own condition types)."""

    type: str
    status: str
    """``"True"``, ``"False"`` or ``"Unknown"``."""
    reason: str
    message: str
    lastTransitionTime: str
    """RFC 3339."""
    observedGeneration: int


def meta(obj: Object) -> Meta:
    """``metadata`` ({} when absent)."""
    return cast(Meta, obj.get("metadata") or {})


def labels(obj: Object) -> Mapping[str, str]:
    """``metadata.labels`` ({} when it has none)."""
    return meta(obj).get("labels") or {}


def is_deleting(obj: Object) -> bool:
    """Deletion requested: ``metadata.deletionTimestamp`` is set (finalizers or a grace period
    may keep the object a while)."""
    return bool(meta(obj).get("deletionTimestamp"))


def condition(obj: Object | None, type_: str) -> Condition | None:
    """The condition of ``type_`` in ``status.conditions``; None when it has none, or ``obj`` is
    None (an object a read did not find)."""
    status = (obj or {}).get("status") or {}
    return next((c for c in status.get("conditions") or [] if c.get("type") == type_), None)


def is_true(obj: Object | None, type_: str) -> bool:
    """Condition ``type_`` is present with status ``"True"``."""
    return (condition(obj, type_) or {}).get("status") == "True"
