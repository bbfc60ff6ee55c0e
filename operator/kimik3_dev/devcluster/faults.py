"""Faults injected into a running dev cluster, the way they happen on real GB300 racks.

- ``tray_not_ready(rest, node)`` / ``tray_ready(rest, node)``: the tray's kubelet reports
  ``Ready=False`` (kwok's ``node-not-ready`` chaos stage, selected by label) and back. The
  node-lifecycle controller of kube-controller-manager then taints it
  ``node.kubernetes.io/not-ready`` (NoSchedule, NoExecute); pods leave after their toleration
  of that taint (300 s unless ``spec.scheduling.tolerations`` says otherwise).
- ``fail_pod(rest, namespace, pod)``: the pod's containers exit with code 1 and it turns
  ``Failed`` (kwok's ``pod-container-running-failed`` stage), as when an engine crashes.
- ``dra_plugin_stopped(rest, node)`` / ``imex_daemon_failed(rest, node)``: the simulated DRA
  driver (``dradriver``) takes the tray's ResourceSlice away (its kubelet plugin is down) / lists
  the tray's ComputeDomain daemon NotReady (its IMEX daemon fails), until called with ``False``.
- ``DevCluster.stop_component`` / ``start_component`` (cluster.py): a component such as the
  LeaderWorkerSet manager down for a while, then started again with the same command line.

Each call returns at once; what follows is the cluster's own doing (kwok applies a stage after
1-2 s, kwok's stage delay plus jitter).
"""

from __future__ import annotations

from typing import Any

from kimik3_dev.devcluster.dradriver import DAEMON_FAILED_LABEL, PLUGIN_STOPPED_LABEL
from kimik3_dev.devcluster.kwok import NODE_NOT_READY_LABEL, POD_FAILED_LABEL
from kimik3_dev.devcluster.rest import Rest

__all__ = ["dra_plugin_stopped", "fail_pod", "imex_daemon_failed", "tray_not_ready", "tray_ready"]

_MERGE = "application/merge-patch+json"


def _label(rest: Rest, path: str, key: str, value: str | None) -> dict[str, Any]:
    return rest.call("PATCH", path, body={"metadata": {"labels": {key: value}}}, content_type=_MERGE)


def tray_not_ready(rest: Rest, node: str) -> dict[str, Any]:
    """Make tray ``node`` report ``Ready=False`` (reason ``nodeFailed``) until ``tray_ready``."""
    return _label(rest, f"/api/v1/nodes/{node}", NODE_NOT_READY_LABEL, "true")


def tray_ready(rest: Rest, node: str) -> dict[str, Any]:
    """Undo ``tray_not_ready``: kwok's ``node-initialize`` stage reports the tray Ready again."""
    return _label(rest, f"/api/v1/nodes/{node}", NODE_NOT_READY_LABEL, None)


def fail_pod(rest: Rest, namespace: str, pod: str) -> dict[str, Any]:
    """Crash every container of a Running pod: exit code 1, reason ``containerFailed``, phase Failed."""
    return _label(rest, f"/api/v1/namespaces/{namespace}/pods/{pod}", POD_FAILED_LABEL, "true")


def dra_plugin_stopped(rest: Rest, node: str, stopped: bool = True) -> dict[str, Any]:
    """Tray ``node``'s DRA kubelet plugin down (its ResourceSlice deleted and not published
    again) or, with ``stopped=False``, back up."""
    return _label(rest, f"/api/v1/nodes/{node}", PLUGIN_STOPPED_LABEL, "true" if stopped else None)


def imex_daemon_failed(rest: Rest, node: str, failed: bool = True) -> dict[str, Any]:
    """Tray ``node``'s ComputeDomain daemon NotReady (``failed``) or Ready again."""
    return _label(rest, f"/api/v1/nodes/{node}", DAEMON_FAILED_LABEL, "true" if failed else None)
