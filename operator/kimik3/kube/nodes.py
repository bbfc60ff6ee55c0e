"""What a node's status means (the API's JSON or the client's ``V1Node``)."""

from __future__ import annotations

from typing import Any

from kimik3.kube.labels import GPU_RESOURCE
from kimik3.kube.objects import field, is_true

READY = "Ready"
"""Node condition: the kubelet is healthy and reports in (``False``/``Unknown``: NotReady)."""


def is_ready(node: Any) -> bool:
    """Condition ``Ready`` is ``True``."""
    return is_true(node, READY)


def labels(node: Any) -> dict[str, str]:
    """The node's labels ({} when it has none)."""
    return field(field(node, "metadata"), "labels") or {}


def name(node: Any) -> str:
    return str(field(field(node, "metadata"), "name"))


def is_schedulable(node: Any) -> bool:
    """Ready and not cordoned (``spec.unschedulable``): a node Kueue's topology-aware scheduling
    counts (it also needs every Topology level label)."""
    return is_ready(node) and not field(field(node, "spec"), "unschedulable")


def allocatable_gpus(node: Any) -> int:
    """``status.allocatable["nvidia.com/gpu"]`` (0 when absent)."""
    return int((field(field(node, "status"), "allocatable") or {}).get(GPU_RESOURCE, 0) or 0)
