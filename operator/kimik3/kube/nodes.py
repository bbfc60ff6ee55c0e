"""What a node's status means (the API's JSON or the client's ``V1Node``)."""

from __future__ import annotations

from typing import Any

from kimik3.kube.objects import is_true

READY = "Ready"
"""Node condition: the kubelet is healthy and reports in (``False``/``Unknown``: NotReady)."""


def is_ready(node: Any) -> bool:
    """Condition ``Ready`` is ``True``."""
    return is_true(node, READY)
