"""What a node's status means (the API's JSON, ``kimik3.kube.objects``)."""

from __future__ import annotations

from kimik3.kube.labels import GPU_RESOURCE
from kimik3.kube.objects import Object, is_true, meta
from kimik3.kube.objects import labels as labels  # re-exported: read as nodes.labels(node)

READY = "Ready"
"""Node condition: the kubelet is healthy and reports in (``False``/``Unknown``: NotReady)."""


def is_ready(node: Object) -> bool:
    """Condition ``Ready`` is ``True``."""
    return is_true(node, READY)


def name(node: Object) -> str:
    return str(meta(node).get("name"))


def is_schedulable(node: Object) -> bool:
    """Ready and not cordoned (``spec.unschedulable``): a node Kueue's topology-aware scheduling
    counts (it also needs every Topology level label)."""
    return is_ready(node) and not (node.get("spec") or {}).get("unschedulable")


def allocatable_gpus(node: Object) -> int:
    """``status.allocatable["nvidia.com/gpu"]`` (0 when absent)."""
    return int(((node.get("status") or {}).get("allocatable") or {}).get(GPU_RESOURCE, 0) or 0)
