"""The nodes as the reconciler needs them: which NVLink domain (rack) each tray is in, for
status.groups, and every node, for the largest free block of trays when Kueue finds no rack.

Node labels change rarely, so the labels are kept from the last list and nodes are listed again
only when a pod is bound to a node not seen yet, or when the free trays are counted. Listing
nodes needs the cluster-wide ``nodes: list`` rule; a namespace-scoped install has none, and then
racks stay unset (retried every ``FORBIDDEN_RETRY_S``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from typing import Any

from kimik3.controller.kube import ApiError, Kube
from kimik3.kube import nodes as knodes
from kimik3.kube.kinds import NODE

FORBIDDEN_RETRY_S = 300.0
"""After a refused node list, seconds before the next try."""
log = logging.getLogger("kimik3.nodes")


class Nodes:
    """Node labels seen through ``kube``, shared by every reconcile (thread-safe)."""

    def __init__(self, kube: Kube):
        self.kube = kube
        self._labels: dict[str, dict[str, str]] = {}
        self._refused_at: float | None = None
        self._lock = threading.Lock()

    def listed(self) -> list[dict[str, Any]] | None:
        """Every node, read now (their labels kept); None when the operator may not list nodes."""
        if self._refused_at is not None and time.monotonic() - self._refused_at < FORBIDDEN_RETRY_S:
            return None
        try:
            items = self.kube.list(*NODE.type_meta, "", "")
        except ApiError as exc:
            log.info("cannot list nodes (%s %s): racks and free trays stay unknown", exc.status, exc.reason)
            self._refused_at = time.monotonic()
            return None
        with self._lock:
            self._refused_at = None
            self._labels = {knodes.name(n): dict(knodes.labels(n)) for n in items}
        return items

    def domains_of(self, names: Iterable[str], topology_key: str) -> dict[str, str]:
        """``{node name: its value of topology_key}`` for the ``names`` that have one; lists the
        nodes again when one of ``names`` was not seen yet."""
        wanted = {n for n in names if n}
        if wanted - self._labels.keys():
            self.listed()
        with self._lock:
            return {n: self._labels[n][topology_key] for n in wanted
                    if topology_key in self._labels.get(n, {})}
