"""Kueue's objects written by hand, for tests on an API server where no Kueue manager runs: a
group's Workload as Kueue writes it for a LeaderWorkerSet, and WorkloadPriorityClasses."""

from __future__ import annotations

from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kimik3.controller.kube import Kube
from kimik3.kube.kinds import WORKLOAD, WORKLOAD_PRIORITY_CLASS

TRANSITION_TIME = "2026-12-01T00:00:00Z"
"""The ``lastTransitionTime`` every hand-written condition carries."""


def workload_name(lws_uid: str, index: int, lws: str = "k3-latency-engine") -> str:
    """The name Kueue gives group ``index``'s Workload of LeaderWorkerSet ``lws`` (UID ``lws_uid``)."""
    return f"leaderworkerset-{lws}-{index}-{lws_uid[:5]}"


def put_workload(kube: Kube, namespace: str, lws_uid: str, index: int, *conditions: dict[str, Any],
                 name: str | None = None, queue: str = "default", priority_class: tuple[str, int] | None = None) -> str:
    """Apply group ``index``'s Workload of the LeaderWorkerSet with UID ``lws_uid`` as Kueue v0.17.0 to
    v0.19.2 writes it (spec abridged: one leader pod set), named ``name`` (default: ``workload_name``
    of the set ``k3-latency-engine``), in LocalQueue ``queue``; with ``priority_class`` (name, value),
    at that WorkloadPriorityClass's priority; then its status ``conditions``, if any, each stamped
    with ``TRANSITION_TIME``. Returns the Workload's name."""
    name = name or workload_name(lws_uid, index)
    spec: dict[str, Any] = {"queueName": queue, "podSets": [{"name": "leader", "count": 1, "template": {
        "spec": {"containers": [{"name": "engine", "image": "x"}]}}}]}
    if priority_class is not None:
        spec["priority"] = priority_class[1]
        spec["priorityClassRef"] = {"group": WORKLOAD_PRIORITY_CLASS.group, "kind": WORKLOAD_PRIORITY_CLASS.kind,
                                    "name": priority_class[0]}
    kube.apply({"apiVersion": WORKLOAD.api_version, "kind": WORKLOAD.kind, "metadata": {
        "name": name, "namespace": namespace, "labels": {"kueue.x-k8s.io/job-uid": lws_uid},
        "annotations": {"kueue.x-k8s.io/component-workload-index": str(index)}}, "spec": spec})
    if conditions:
        stamped = [{**c, "lastTransitionTime": TRANSITION_TIME} for c in conditions]
        kube.patch_merge(*WORKLOAD.type_meta, namespace, name, {"status": {"conditions": stamped}},
                         subresource="status")
    return name


def create_priority_classes(admin_api: client.ApiClient, *classes: tuple[str, int]) -> None:
    """Create the WorkloadPriorityClasses ``classes`` (name, value; cluster-scoped, left for later
    tests) unless another test made them."""
    api = client.CustomObjectsApi(admin_api)
    for name, value in classes:
        try:
            api.create_cluster_custom_object(WORKLOAD_PRIORITY_CLASS.group, WORKLOAD_PRIORITY_CLASS.version,
                                             WORKLOAD_PRIORITY_CLASS.plural, {
                                                 "apiVersion": WORKLOAD_PRIORITY_CLASS.api_version,
                                                 "kind": WORKLOAD_PRIORITY_CLASS.kind, "metadata": {"name": name},
                                                 "value": value})
        except ApiException as exc:
            if exc.status != 409:  # AlreadyExists
                raise
