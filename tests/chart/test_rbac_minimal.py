"""The chart's RBAC is minimal: every verb of every rule of the rendered ClusterRole backs a named
operator behaviour, shown by taking that one verb away and watching the behaviour break.

The chart is installed (cluster-wide). For each (resource, verb) of its ClusterRole, the operator
runs as its own process (the chart's Deployment command) under an identity that has the
ClusterRole less that verb, and drives one scenario, step by named step, stopping at the first
behaviour that does not happen. With the full ClusterRole every step happens (the baselines);
without the verb exactly the behaviour named in ``EXPECTED`` fails. A verb whose removal breaks
nothing makes its test fail: such a rule must go.

Identities: namespaced behaviours run ten at a time, each under a service account of its own
whose token the API server mints (TokenRequest), bound to a copy of the ClusterRole less one verb,
its operator watching one namespace of its own. The late-CRD baseline runs once more,
cluster-wide, as the chart installed it: the chart's ServiceAccount token and ClusterRole.

The leader-election Role (the chart's Role for its Lease in the release namespace) is checked
the same way: each namespaced identity gets a copy of it for a Lease of its own name (less the
verb taken away), and its operator elects itself on that Lease. So is the wake Role (the
ReferenceGrants in the release namespace), in the same copy.

Scenario (one fresh namespace each run), in order:
  lead                 the operator holds its Lease and has renewed it once
  reconcile            the CR gets the teardown finalizer
  sweep stale grant    the namespace's wake ReferenceGrant, left before the operator started while
                       no deployment there needs it, is deleted (the first reconcile's sweep,
                       controller/grants.py: lists the grants, reads the namespace, deletes)
  apply <Kind>         each child exists (ComputeDomain, ConfigMap, LeaderWorkerSet, Service,
                       PodDisruptionBudget, PodMonitor, HTTPRoute; two groups, monitoring, a route;
                       placement kueue: the ComputeDomain and the groups only once the LocalQueue
                       was read)
  status               status.observedGeneration is written
  event                the Applied Event is recorded
  stage weights        a second CR with a model cache staged from the hub gets its claim, the
                       stager ServiceAccount, and two Jobs with their Roles and RoleBindings
  follow LeaderWorkerSet  the CR turns Ready soon after the LWS reports its groups ready
  heal <Kind>          a deleted child is back within HEAL_WINDOW_S (the resync is minutes away)
  follow pods          a leader pod that appears (bound to a tray) shows up in the Ready message
  channel devices      that pod's tray has no ResourceSlice of the ComputeDomain driver:
                       ComputeDomainReady=False ResourceSliceMissing names it (checked before any
                       FailedPrepareDynamicResources Event: a due PrepareFailed outranks it)
  prepare failure      a pod Pending on its node with the kubelet's FailedPrepareDynamicResources
                       Event older than its bound: ComputeDomainReady=False PrepareFailed (F19 b)
  follow Workloads     (placement kueue) a group's Workload pending on quota shows as
                       ScalingLimited=True QuotaExhausted with Kueue's message
  set group priority   (placement kueue, burstPriorityClass) the operator writes the reserved
                       class's value, read from its WorkloadPriorityClass, into that Workload's
                       spec.priority
  free block           the Workload now finds no rack: NoRackFits names the largest free block
                       of trays, counted from the nodes (a tray of this run's own)
  readmit split group  an admitted group whose pods are bound in two racks: the operator
                       deletes its Workload for Kueue to create and admit a fresh one whole
  remove <Kind>        replicas 1, monitoring off, no route: the budget, PodMonitor, HTTPRoute go;
                       a new launch plan (engine.maxNumSeqs), and once the LeaderWorkerSet says
                       it saw it (no group left), the old plan's launcher ConfigMap goes
  apply <Kind>         a third CR with spec.routing and a route: the endpoint picker's
                       ServiceAccount, Role (it grants what the operator holds), RoleBinding,
                       ConfigMap, Deployment, Service and the InferencePool exist
  gateway status       the route's Gateway is read: GatewayReady=False GatewayNotFound
  heal <Kind>          the picker's watched children come back when deleted
  remove routing       routing off: every one of them goes
  wake route           spec.idle.stopAfter on that CR, no group serving: its HTTPRoute names the
                       chart's wake Service, after the ReferenceGrant kimik3-wake-<namespace> in the
                       release namespace (the chart's wake Role; checked like the Lease's Role)
  release wake grant   spec.idle removed from that CR, the namespace's last one needing the grant:
                       the ReferenceGrant is deleted
  teardown <step>      deleting the CR deletes the LeaderWorkerSet, then the ComputeDomain, then
                       releases the CR
The "late CRD" variant (cluster-wide, the chart's own identity) deletes the HTTPRoute CRD before
the operator starts and installs it again after ("heal HTTPRoute" then needs the operator's
look-up of kinds served late, controller/lateapis.py; the chart grants nothing on CRDs), and at
the end deletes it again:
  survive CRD removal  the operator keeps running and healthy (its watch of the kind waits out
                       the 404s, controller/lateapis.py; kopf alone would let the 404 end it)
"""

from __future__ import annotations

import contextlib
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from kimik3.controller.computedomains import PREPARE_POLL_S
from kimik3.controller.kube import ApiError, Kube
from kimik3.controller.lateapis import PERIOD_S
from kimik3.controller.steps import RESYNC_READY_S, RESYNC_STARTING_S
from kimik3.kube.kinds import LEASE
from kimik3_dev.devcluster import kueue
from kimik3_dev.devcluster.controlplane import ControlPlane
from kimik3_dev.devcluster.rbac import request_token, write_token_kubeconfig
from kimik3_dev.devcluster.thirdparty import thirdparty_crd_paths
from kimik3.render.meta import engine_set_name
from kimik3.render.wake import WakeEndpoint, reference_grant
from kimik3.kube.times import rfc3339

from support.cluster import CR, LWS, apply, condition, http_status, make_namespace, metric, metric_samples
from support.kueue import create_priority_classes, put_workload
from support.recipes import recipe
from support.rendering import launcher_name
from support.waiting import WaitTimeout, wait_for

from .conftest import CHART, RELEASE, RELEASE_NAMESPACE, Helm, OperatorProcess, deployment_args, uninstall_if_present

pytestmark = pytest.mark.timeout(900)
"""The module's fixture runs ~55 operator scenarios, 10 at a time: 4-12 min on the shared 2-core machine."""

NAME = "k3-rbac"
ENGINE = engine_set_name(NAME)
LAUNCHER = launcher_name(recipe(name=NAME))
"""The launcher ConfigMap of the scenario's CR (its name depends on the launch plan alone)."""
NEW_SEQS = 128
"""engine.maxNumSeqs of the "remove ConfigMap" step: a new launch plan, so a new ConfigMap."""
CHILDREN = [  # apply order, with the name each child gets
    (("resource.nvidia.com/v1beta1", "ComputeDomain"), NAME),
    (("v1", "ConfigMap"), LAUNCHER),
    (LWS, ENGINE),
    (("v1", "Service"), NAME),
    (("policy/v1", "PodDisruptionBudget"), NAME),
    (("monitoring.coreos.com/v1", "PodMonitor"), NAME),
    (("gateway.networking.k8s.io/v1", "HTTPRoute"), NAME),
]
ROUTED = "k3-routed"
"""A third deployment with spec.routing (no groups): its endpoint picker and InferencePool."""
ROUTING_CHILDREN = [  # apply order, with the name each child gets
    (("v1", "ServiceAccount"), f"{ROUTED}-epp"),
    (("rbac.authorization.k8s.io/v1", "Role"), f"{ROUTED}-epp"),
    (("rbac.authorization.k8s.io/v1", "RoleBinding"), f"{ROUTED}-epp"),
    (("v1", "ConfigMap"), f"{ROUTED}-epp"),
    (("apps/v1", "Deployment"), f"{ROUTED}-epp"),
    (("v1", "Service"), f"{ROUTED}-epp"),
    (("inference.networking.k8s.io/v1", "InferencePool"), ROUTED),
]
HTTPROUTE_CRD = "httproutes.gateway.networking.k8s.io"
HEAL_WINDOW_S = 20.0
"""A deleted child must be back this soon: only a watch event, not the operator's periodic resync
(``RESYNC_STARTING_S`` 120 s, ``RESYNC_READY_S`` 600 s), can do that. 8 s missed once on the
2-core machine with ten operators starting at once (a late CRD's kopf observation took longer)."""
PARALLEL = 10
"""Scenarios run at once (each mostly waits on the API server)."""

# (resource, verb) of the ClusterRole -> the behaviour that breaks without it.
EXPECTED: dict[tuple[str, str], str] = {
    ("kimik3deployments", "get"): "reconcile",
    ("kimik3deployments", "list"): "reconcile",
    ("kimik3deployments", "watch"): "reconcile",
    ("kimik3deployments", "patch"): "reconcile",
    ("kimik3deployments/status", "patch"): "status",
    ("leaderworkersets", "list"): "follow LeaderWorkerSet",
    ("leaderworkersets", "watch"): "follow LeaderWorkerSet",
    ("leaderworkersets", "create"): "apply LeaderWorkerSet",
    ("leaderworkersets", "patch"): "apply LeaderWorkerSet",
    ("leaderworkersets", "delete"): "retire old LeaderWorkerSet",
    ("computedomains", "get"): "teardown ComputeDomain released",
    ("computedomains", "list"): "heal ComputeDomain",
    ("computedomains", "watch"): "heal ComputeDomain",
    ("computedomains", "create"): "apply ComputeDomain",
    ("computedomains", "patch"): "apply ComputeDomain",
    ("computedomains", "delete"): "teardown ComputeDomain released",
    ("podmonitors", "list"): "heal PodMonitor",
    ("podmonitors", "watch"): "heal PodMonitor",
    ("podmonitors", "create"): "apply PodMonitor",
    ("podmonitors", "patch"): "apply PodMonitor",
    ("podmonitors", "delete"): "remove PodMonitor",
    ("httproutes", "list"): "heal HTTPRoute",
    ("httproutes", "watch"): "heal HTTPRoute",
    ("httproutes", "create"): "apply HTTPRoute",
    ("httproutes", "patch"): "apply HTTPRoute",
    ("httproutes", "delete"): "remove HTTPRoute",
    ("poddisruptionbudgets", "list"): "heal PodDisruptionBudget",
    ("poddisruptionbudgets", "watch"): "heal PodDisruptionBudget",
    ("poddisruptionbudgets", "create"): "apply PodDisruptionBudget",
    ("poddisruptionbudgets", "patch"): "apply PodDisruptionBudget",
    ("poddisruptionbudgets", "delete"): "remove PodDisruptionBudget",
    ("configmaps", "list"): "heal ConfigMap",
    ("configmaps", "watch"): "heal ConfigMap",
    ("configmaps", "create"): "apply ConfigMap",
    ("configmaps", "patch"): "apply ConfigMap",
    ("configmaps", "delete"): "remove ConfigMap",
    ("services", "list"): "heal Service",
    ("services", "watch"): "heal Service",
    ("services", "create"): "apply Service",
    ("services", "patch"): "apply Service",
    ("services", "delete"): "remove routing",
    ("pods", "list"): "follow pods",
    ("pods", "watch"): "follow pods",
    # held to grant them in the endpoint picker's Role: without one the Role is refused (escalation)
    ("pods", "get"): "apply Role",
    **{(resource, verb): "apply Role" for resource in ("inferencepools", "inferenceobjectives")
       for verb in ("get", "list", "watch")},
    ("inferencepools", "create"): "apply InferencePool",
    ("inferencepools", "patch"): "apply InferencePool",
    ("inferencepools", "delete"): "remove routing",
    ("deployments", "list"): "heal Deployment",
    ("deployments", "watch"): "heal Deployment",
    ("deployments", "create"): "apply Deployment",
    ("deployments", "patch"): "apply Deployment",
    ("deployments", "delete"): "remove routing",
    ("gateways", "get"): "gateway status",
    **{(resource, verb): f"heal {kind}" for resource, kind in (
        ("serviceaccounts", "ServiceAccount"), ("roles", "Role"), ("rolebindings", "RoleBinding"))
       for verb in ("list", "watch")},
    **{(resource, "delete"): "remove routing" for resource in ("serviceaccounts", "roles", "rolebindings")},
    ("namespaces", "get"): "sweep stale grant",
    ("events", "create"): "event",
    ("events", "list"): "prepare failure",
    ("workloads", "list"): "follow Workloads",
    ("localqueues", "get"): "apply ComputeDomain",  # no group (nor its ComputeDomain) before the queue is checked
    ("nodes", "list"): "free block",
    ("resourceslices", "list"): "channel devices",
    ("workloads", "delete"): "readmit split group",
    ("workloads", "patch"): "set group priority",
    ("workloadpriorityclasses", "get"): "set group priority",
    **{(resource, verb): "stage weights" for resource, verbs in (
        ("persistentvolumeclaims", ("get", "create", "patch")), ("jobs", ("get", "create", "patch")),
        ("serviceaccounts", ("create", "patch")), ("roles", ("create", "patch")),
        ("rolebindings", ("create", "patch"))) for verb in verbs},
}
PREPARE_WINDOW_S = HEAL_WINDOW_S + 2 * PREPARE_POLL_S
"""The Event is past its bound when written, but a reconcile that listed the Events just before it
looks again only after ``PREPARE_POLL_S``: 20 s missed once with ten operators starting at once."""
LEASE_ROLE = f"{RELEASE}-leader-election"
GRANT = ("gateway.networking.k8s.io/v1beta1", "ReferenceGrant")
# (resource, verb) of the chart's leader-election Role -> the behaviour that breaks without it.
LEASE_EXPECTED: dict[tuple[str, str], str] = {
    ("leases", "create"): "lead",
    ("leases", "get"): "lead",
    ("leases", "update"): "lead",
}
WAKE_ROLE = f"{RELEASE}-wake"
# (resource, verb) of the chart's wake Role -> the behaviour that breaks without it.
WAKE_EXPECTED: dict[tuple[str, str], str] = {
    ("referencegrants", "create"): "wake route",
    ("referencegrants", "patch"): "wake route",
    ("referencegrants", "list"): "sweep stale grant",
    ("referencegrants", "delete"): "sweep stale grant",
}
NAMESPACED_EXPECTED = {**LEASE_EXPECTED, **WAKE_EXPECTED}
"""The verbs of the identities' Role in the release namespace (a copy of both Roles)."""
WAKE_PORT = 8081
"""The chart's wake.port (its default)."""
LEASE_RENEWED_S = 20.0
"""The Lease is created and renewed once this soon (retry period 2 s; 10 s missed once in CI with
ten operators starting at once on 2 cores)."""


class Broken(Exception):
    """A named behaviour did not happen."""

    def __init__(self, behaviour: str, detail: str):
        super().__init__(f"{behaviour}: {detail}")
        self.behaviour = behaviour


def expect(behaviour: str, fn: Callable[[], Any], timeout: float) -> Any:
    try:
        return wait_for(fn, timeout, behaviour, interval=0.1)
    except AssertionError as exc:
        raise Broken(behaviour, str(exc)) from None


QUEUE = "tenant"
"""The scenario's LocalQueue (no Kueue manager runs here: it never gets a status, so it does not hold groups)."""


def cr_body(namespace: str) -> dict[str, Any]:
    body = recipe(name=NAME, namespace=namespace, replicas=2, disruptionBudget={"minAvailable": 1})
    body["spec"]["service"] = {"httpRoute": {"parentRefs": [{"name": "gw"}]}}
    body["spec"]["scheduling"] = {"placement": {"mode": "kueue", "queueName": QUEUE, "priorityClass": RESERVED_CLASS[0],
                                                "burstPriorityClass": BURST_CLASS[0]}}
    return body


RESERVED_CLASS, BURST_CLASS = ("rbac-reserved", 1000), ("rbac-burst", 100)
"""The scenario's WorkloadPriorityClasses (name, value): its groups are all reserved (no autoscaling)."""


QUOTA_MESSAGE = ("couldn't assign flavors to pod set leader: insufficient unused quota for nvidia.com/gpu in "
                 "flavor gb300, 8 more needed")


NO_RACK_MESSAGE = 'couldn\'t assign flavors to pod set leader: topology "nvl72" doesn\'t allow to fit any of 2 pod(s)'


def pending_workload(kube: Kube, namespace: str, lws_uid: str, message: str = QUOTA_MESSAGE) -> None:
    """Group 1 pending: its queue's quota (or no rack) cannot hold it."""
    put_workload(kube, namespace, lws_uid, 1,
                 {"type": "QuotaReserved", "status": "False", "reason": "Pending", "message": message},
                 name=f"{ENGINE}-1-quota", queue=QUEUE)


def split_group(kube: Kube, core: client.CoreV1Api, namespace: str, lws_uid: str) -> None:
    """Group 0 admitted by Kueue, its leader and worker bound in two racks (as Kueue's node
    replacement leaves a TP8 group after its worker's tray failed, kueue#6957): a second tray in a
    rack of its own, and the group's Workload and pods."""
    tray = f"tray-{namespace}-b"
    core.create_node({"metadata": {"name": tray, "labels": {"nvidia.com/gpu.clique": f"{namespace}-b",
                                                           "nvidia.com/gpu.product": "NVIDIA-GB300"}}})
    put_workload(kube, namespace, lws_uid, 0,
                 {"type": "Admitted", "status": "True", "reason": "Admitted", "message": "The workload is admitted"},
                 name=f"{ENGINE}-0-split", queue=QUEUE)
    for worker, node in (("0", f"tray-{namespace}"), ("1", tray)):
        core.create_namespaced_pod(namespace, {"metadata": {"name": f"{ENGINE}-0-{worker}", "labels": {
            "leaderworkerset.sigs.k8s.io/name": ENGINE, "leaderworkerset.sigs.k8s.io/group-index": "0",
            "leaderworkerset.sigs.k8s.io/worker-index": worker, "app.kubernetes.io/managed-by": "kimik3-operator",
            "inference.kimik3.io/deployment": NAME}},
            "spec": {"nodeName": node, "containers": [{"name": "engine", "image": "x"}]}})


def unprepared_pod(core: client.CoreV1Api, namespace: str) -> None:
    """Group 1's leader Pending on its node, with the kubelet's FailedPrepareDynamicResources Event
    of a minute ago (past the bound of a pod with no grace period, 15 s), then its status as the
    kubelet writes it (the pod watch's event)."""
    pod = core.create_namespaced_pod(namespace, {"metadata": {"name": f"{ENGINE}-1", "labels": {
        "leaderworkerset.sigs.k8s.io/name": ENGINE, "leaderworkerset.sigs.k8s.io/group-index": "1",
        "leaderworkerset.sigs.k8s.io/worker-index": "0", "app.kubernetes.io/managed-by": "kimik3-operator",
        "inference.kimik3.io/deployment": NAME}}, "spec": {"nodeName": f"tray-{namespace}", "terminationGracePeriodSeconds": 0,
                                                             "containers": [{"name": "engine", "image": "x"}]}})
    at = rfc3339(time.time() - 60)
    core.create_namespaced_event(namespace, {
        "metadata": {"name": f"{ENGINE}-1.prepare", "namespace": namespace},
        "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": pod.metadata.name, "namespace": namespace,
                           "uid": pod.metadata.uid},
        "type": "Warning", "reason": "FailedPrepareDynamicResources", "source": {"component": "kubelet"},
        "message": "Failed to prepare dynamic resources: channel 0 is already allocated",
        "firstTimestamp": at, "lastTimestamp": at, "count": 1})
    core.patch_namespaced_pod_status(pod.metadata.name, namespace, {"status": {"phase": "Pending"}})


STAGED = "k3-staged"
"""A second deployment whose model cache is staged from the hub (its Jobs never run here)."""


def staging_objects(kube: Kube, namespace: str) -> list[tuple[tuple[str, str], str]]:
    """What the operator creates to stage ``STAGED``'s cache: the claim, the stager ServiceAccount,
    and per artifact (target, drafter) a Job with its Role and RoleBinding."""
    jobs = kube.list("batch/v1", "Job", namespace, "inference.kimik3.io/stager=true")
    if len(jobs) != 2:
        return [(("batch/v1", "Job"), "two staging Jobs")]
    out = [(("v1", "PersistentVolumeClaim"), "k3-cache"), (("v1", "ServiceAccount"), "kimik3-stager")]
    for job in jobs:
        name = job["metadata"]["name"]
        out += [(("rbac.authorization.k8s.io/v1", "Role"), name), (("rbac.authorization.k8s.io/v1", "RoleBinding"), name)]
    return out


def scenario(kube: Kube, core: client.CoreV1Api, namespace: str, lease: str) -> None:
    """Drive the operator through every behaviour; raise Broken at the first that fails."""
    get = kube.get

    def renewed() -> bool:
        spec = (get(LEASE.api_version, LEASE.kind, RELEASE_NAMESPACE, lease) or {}).get("spec") or {}
        return bool(spec.get("holderIdentity")) and spec.get("renewTime") != spec.get("acquireTime")
    expect("lead", renewed, LEASE_RENEWED_S)
    kube.apply(kueue.local_queue(namespace, kueue.CLUSTER_QUEUE, QUEUE))  # as a tenant's admin makes it
    apply(kube, cr_body(namespace))
    expect("reconcile", lambda: "inference.kimik3.io/teardown" in (get(*CR, namespace, NAME)["metadata"]
                                                                      .get("finalizers") or []), 15)
    expect("sweep stale grant", lambda: get(*GRANT, RELEASE_NAMESPACE, f"kimik3-wake-{namespace}") is None, 15)
    for (api_version, kind), name in CHILDREN:
        expect(f"apply {kind}", lambda: get(api_version, kind, namespace, name), 15)
    expect("status", lambda: (get(*CR, namespace, NAME).get("status") or {}).get("observedGeneration") == 1, 15)
    expect("event", lambda: any(e.reason == "Applied" and e.involved_object.name == NAME
                                for e in core.list_namespaced_event(namespace).items), 10)

    staged = recipe(name=STAGED, namespace=namespace)
    staged["spec"]["model"]["source"] = {"cache": {"claimName": "k3-cache", "create": {"size": "10Gi"}, "hub": {}}}
    apply(kube, staged)
    expect("stage weights", lambda: all(get(*kind, namespace, name) for kind, name in staging_objects(kube, namespace)),
           15)

    kube.patch_merge(*LWS, namespace, ENGINE, {"status": {"replicas": 2, "readyReplicas": 2}},
                     subresource="status")
    expect("follow LeaderWorkerSet",
           lambda: condition(get(*CR, namespace, NAME), "Ready").get("status") == "True", HEAL_WINDOW_S)
    for (api_version, kind), name in CHILDREN:
        if kind == "LeaderWorkerSet":
            continue
        before = get(api_version, kind, namespace, name)["metadata"]["uid"]
        kube.delete(api_version, kind, namespace, name)
        expect(f"heal {kind}", lambda: (get(api_version, kind, namespace, name) or {"metadata": {"uid": before}})
               ["metadata"]["uid"] != before, HEAL_WINDOW_S)

    kube.patch_merge(*LWS, namespace, ENGINE, {"status": {"replicas": 2, "readyReplicas": 1}},
                     subresource="status")
    expect("follow LeaderWorkerSet",
           lambda: condition(get(*CR, namespace, NAME), "Ready").get("status") == "False", HEAL_WINDOW_S)
    pod = f"{ENGINE}-0"
    core.create_namespaced_pod(namespace, {"metadata": {"name": pod, "labels": {
        "leaderworkerset.sigs.k8s.io/name": ENGINE, "leaderworkerset.sigs.k8s.io/group-index": "0",
        "leaderworkerset.sigs.k8s.io/worker-index": "0", "app.kubernetes.io/managed-by": "kimik3-operator",
        "inference.kimik3.io/deployment": NAME}}, "spec": {"nodeName": f"tray-{namespace}",
                                                             "containers": [{"name": "engine", "image": "x"}]}})
    expect("follow pods", lambda: pod in condition(get(*CR, namespace, NAME), "Ready").get("message", ""),
           HEAL_WINDOW_S)
    # before any FailedPrepareDynamicResources Event: PrepareFailed, once due, outranks ResourceSliceMissing
    expect("channel devices", lambda: condition(get(*CR, namespace, NAME), "ComputeDomainReady").get("reason")
           == "ResourceSliceMissing", HEAL_WINDOW_S)
    core.delete_namespaced_pod(pod, namespace, grace_period_seconds=0)
    wait_for(lambda: pod not in {p.metadata.name for p in core.list_namespaced_pod(namespace).items}, 10,
             "the test pod gone")
    unprepared_pod(core, namespace)
    expect("prepare failure", lambda: condition(get(*CR, namespace, NAME), "ComputeDomainReady").get("reason")
           == "PrepareFailed", PREPARE_WINDOW_S)
    core.delete_namespaced_pod(f"{ENGINE}-1", namespace, grace_period_seconds=0)

    pending_workload(kube, namespace, get(*LWS, namespace, ENGINE)["metadata"]["uid"])
    kube.patch_merge(*LWS, namespace, ENGINE, {"status": {"replicas": 2, "readyReplicas": 0}},
                     subresource="status")  # an LWS event: the operator reconciles and lists the Workloads
    expect("follow Workloads", lambda: (lambda c: c.get("reason") == "QuotaExhausted" and QUOTA_MESSAGE in
                                        c.get("message", ""))(condition(get(*CR, namespace, NAME), "ScalingLimited")),
           HEAL_WINDOW_S)
    expect("set group priority", lambda: (get("kueue.x-k8s.io/v1beta2", "Workload", namespace, f"{ENGINE}-1-quota")
                                          or {}).get("spec", {}).get("priority") == RESERVED_CLASS[1], HEAL_WINDOW_S)
    tray = f"tray-{namespace}"
    core.create_node({"metadata": {"name": tray, "labels": {"nvidia.com/gpu.clique": namespace,
                                                           "nvidia.com/gpu.product": "NVIDIA-GB300"}}})
    core.patch_node_status(tray, {"status": {"allocatable": {"nvidia.com/gpu": "4"},
                                             "conditions": [{"type": "Ready", "status": "True"}]}})
    pending_workload(kube, namespace, get(*LWS, namespace, ENGINE)["metadata"]["uid"], NO_RACK_MESSAGE)
    kube.patch_merge(*LWS, namespace, ENGINE, {"status": {"replicas": 2, "readyReplicas": 1}},
                     subresource="status")
    expect("free block", lambda: (lambda c: c.get("reason") == "NoRackFits" and "the largest free block is" in
                                  c.get("message", ""))(condition(get(*CR, namespace, NAME), "ScalingLimited")),
           HEAL_WINDOW_S)
    split_group(kube, core, namespace, get(*LWS, namespace, ENGINE)["metadata"]["uid"])
    expect("readmit split group", lambda: get("kueue.x-k8s.io/v1beta2", "Workload", namespace,
                                              f"{ENGINE}-0-split") is None, HEAL_WINDOW_S)
    for worker in ("0", "1"):
        core.delete_namespaced_pod(f"{ENGINE}-0-{worker}", namespace, grace_period_seconds=0)

    # a new launch plan, rolled out with Recreate (no LWS manager here to make the new groups Ready):
    # a new LeaderWorkerSet, the old one retired at once, then its ConfigMap pruned
    kube.patch_merge(*CR, namespace, NAME, {"spec": {"replicas": 1, "monitoring": {"enabled": False},
                                                     "service": {"httpRoute": None},
                                                     "engine": {"maxNumSeqs": NEW_SEQS},
                                                     "rollout": {"strategy": "Recreate"}}})
    for api_version, kind in [("policy/v1", "PodDisruptionBudget"), ("monitoring.coreos.com/v1", "PodMonitor"),
                              ("gateway.networking.k8s.io/v1", "HTTPRoute")]:
        expect(f"remove {kind}", lambda: get(api_version, kind, namespace, NAME) is None, 8)

    def deployment_lwss() -> list[str]:
        return [o["metadata"]["name"] for o in kube.list(*LWS, namespace, f"inference.kimik3.io/deployment={NAME}")
                if not o["metadata"].get("deletionTimestamp")]
    expect("apply LeaderWorkerSet", lambda: any(n.startswith(f"{ENGINE}-") for n in deployment_lwss()), 8)
    expect("retire old LeaderWorkerSet", lambda: ENGINE not in deployment_lwss(), 8)
    expect("remove ConfigMap", lambda: get("v1", "ConfigMap", namespace, LAUNCHER) is None, 8)

    apply(kube, recipe(name=ROUTED, namespace=namespace, replicas=0, monitoring={"enabled": False},
                       routing={"enabled": True}, service={"httpRoute": {"parentRefs": [{"name": "gw"}]}}))
    for (api_version, kind), name in ROUTING_CHILDREN:
        expect(f"apply {kind}", lambda: get(api_version, kind, namespace, name), 15)
    expect("gateway status", lambda: condition(get(*CR, namespace, ROUTED), "GatewayReady").get("reason")
           == "GatewayNotFound", HEAL_WINDOW_S)
    for (api_version, kind), name in ROUTING_CHILDREN:
        if kind in ("ConfigMap", "Service", "InferencePool"):  # ConfigMap, Service: healed above; the pool's
            continue                                            # list/watch are proven by apply Role
        before = get(api_version, kind, namespace, name)["metadata"]["uid"]
        kube.delete(api_version, kind, namespace, name)
        expect(f"heal {kind}", lambda: (get(api_version, kind, namespace, name) or {"metadata": {"uid": before}})
               ["metadata"]["uid"] != before, HEAL_WINDOW_S)
    kube.patch_merge(*CR, namespace, ROUTED, {"spec": {"routing": {"enabled": False}}})
    expect("remove routing", lambda: all(get(api_version, kind, namespace, name) is None
                                         for (api_version, kind), name in ROUTING_CHILDREN), 8)
    kube.patch_merge(*CR, namespace, ROUTED, {"spec": {"idle": {"stopAfter": "60m"},
                                                       "autoscaling": {"metricsSource": {"type": "podScrape"}}}})
    expect("wake route", lambda: get(*GRANT, RELEASE_NAMESPACE, f"kimik3-wake-{namespace}") and [
        b["name"] for r in get("gateway.networking.k8s.io/v1", "HTTPRoute", namespace, ROUTED)["spec"]["rules"]
        for b in r["backendRefs"]] == [WAKE_ROLE], 8)  # the wake Service is named like its Role
    kube.patch_merge(*CR, namespace, ROUTED, {"spec": {"idle": None}})  # the namespace's last user of the grant
    expect("release wake grant", lambda: get(*GRANT, RELEASE_NAMESPACE, f"kimik3-wake-{namespace}") is None, 8)

    kube.delete(*CR, namespace, NAME)
    expect("teardown LeaderWorkerSet deleted", lambda: not deployment_lwss(), 8)
    expect("teardown ComputeDomain released",
           lambda: get("resource.nvidia.com/v1beta1", "ComputeDomain", namespace, NAME) is None, 10)
    expect("teardown CR released", lambda: get(*CR, namespace, NAME) is None, 10)


CANARY = "k3-canary"
CANARY_ENGINE = engine_set_name(CANARY)
CANARY_LABELS = {"app.kubernetes.io/managed-by": "kimik3-operator", "inference.kimik3.io/deployment": CANARY,
                 "leaderworkerset.sigs.k8s.io/name": CANARY_ENGINE}
GATED = ("kimik3deployments", "leaderworkersets", "pods")
"""Kinds whose first listing must be over before the steps that a late listing could fake."""


def plant_canaries(kube: Kube, core: client.CoreV1Api, namespace: str) -> None:
    """Objects that exist before the operator starts, so that its first listing of CRs,
    LeaderWorkerSets and pods shows up in its watch-event counters: a step must never pass
    because a listing happened late rather than because a watch delivered the event."""
    canary = cr_body(namespace)
    canary["metadata"]["name"] = CANARY
    canary["spec"].update(replicas=0, monitoring={"enabled": False}, service={})
    apply(kube, canary)
    apply(kube, {"apiVersion": LWS[0], "kind": LWS[1], "metadata": {
        "name": CANARY_ENGINE, "namespace": namespace, "labels": CANARY_LABELS},
        "spec": {"replicas": 0, "leaderWorkerTemplate": {"size": 1, "workerTemplate": {
            "spec": {"containers": [{"name": "engine", "image": "x"}]}}}}})
    core.create_namespaced_pod(namespace, {"metadata": {"name": f"{CANARY_ENGINE}-0", "labels": CANARY_LABELS},
                                           "spec": {"containers": [{"name": "engine", "image": "x"}]}})
    kube.apply(stale_grant(namespace))


def stale_grant(namespace: str) -> dict[str, Any]:
    """The namespace's wake ReferenceGrant as an operator that never deleted them (before
    controller/grants.py) left it: no deployment of the namespace needs it."""
    return reference_grant(WakeEndpoint(RELEASE_NAMESPACE, WAKE_ROLE, WAKE_PORT), namespace)


def await_first_listings(op: OperatorProcess, timeout: float = 15.0) -> None:
    """Wait (bounded) until the operator has listed the gated kinds. A kind it may not list never
    gets there: the steps that need it then fail as they should, so running out of time is no error."""
    def listed() -> bool:
        samples = metric_samples(op.url)
        return all(metric(samples, "kimik3_watch_events_total", resource=kind) >= 1 for kind in GATED)
    with contextlib.suppress(WaitTimeout):
        wait_for(listed, timeout, "the operator's first listings")


def cleanup(kube: Kube, namespace: str) -> None:
    """Whatever the broken operator left (no garbage collector runs here), and the scenario's tray."""
    for tray in (f"tray-{namespace}", f"tray-{namespace}-b"):
        with contextlib.suppress(ApiError):
            kube.request("DELETE", f"/api/v1/nodes/{tray}")
    for name in (NAME, CANARY, STAGED, ROUTED):
        obj = kube.get(*CR, namespace, name)
        if obj is not None:
            if obj["metadata"].get("finalizers"):
                kube.patch_merge(*CR, namespace, name, {"metadata": {"finalizers": None}})
            kube.delete(*CR, namespace, name)
    kube.delete(*GRANT, RELEASE_NAMESPACE, f"kimik3-wake-{namespace}")
    for configmap in kube.list("v1", "ConfigMap", namespace, "app.kubernetes.io/managed-by=kimik3-operator"):
        with contextlib.suppress(ApiError):
            kube.delete("v1", "ConfigMap", namespace, configmap["metadata"]["name"])
    for (api_version, kind), name in [*CHILDREN, *ROUTING_CHILDREN, (LWS, CANARY_ENGINE),
                                      (("v1", "Service"), CANARY), (("v1", "Pod"), f"{CANARY_ENGINE}-0")]:
        try:
            kube.delete(api_version, kind, namespace, name)
        except ApiError:
            pass


def clusterrole_rules(admin_api: client.ApiClient, name: str = RELEASE) -> list[dict[str, Any]]:
    role = client.RbacAuthorizationV1Api(admin_api).read_cluster_role(name)
    return [admin_api.sanitize_for_serialization(r) for r in role.rules]


def allowed(api: client.ApiClient, group: str, resource: str, verb: str) -> bool:
    """What the authorizer answers the caller (a SelfSubjectAccessReview)."""
    plural, _, sub = resource.partition("/")
    attrs = {"group": group, "resource": plural, "subresource": sub, "verb": verb, "namespace": "rbac-probe"}
    if group == "apiextensions.k8s.io":
        attrs.pop("namespace")
    review = client.AuthorizationV1Api(api).create_self_subject_access_review({"spec": {"resourceAttributes": attrs}})
    return bool(review.status.allowed)


def without(rules: list[dict[str, Any]], resource: str | None, verb: str | None) -> list[dict[str, Any]]:
    out = []
    for rule in rules:
        if rule["resources"] == [resource]:
            rule = {**rule, "verbs": [v for v in rule["verbs"] if v != verb]}
            if not rule["verbs"]:
                continue
        out.append(rule)
    return out


def group_of(rules: list[dict[str, Any]], resource: str) -> str:
    return next(r["apiGroups"][0] for r in rules if r["resources"] == [resource])


WATCHED_PATHS = ["/apis/inference.kimik3.io/v1alpha1/kimik3deployments", "/api/v1/pods", "/api/v1/configmaps",
                 "/api/v1/services", "/apis/policy/v1/poddisruptionbudgets",
                 "/apis/leaderworkerset.x-k8s.io/v1/leaderworkersets",
                 "/apis/resource.nvidia.com/v1beta1/computedomains", "/apis/monitoring.coreos.com/v1/podmonitors",
                 "/apis/gateway.networking.k8s.io/v1/httproutes"]


def warm_watch_caches(kube: Kube, skip: tuple[str, ...] = ()) -> None:
    """Wait until the API server serves every watched kind from its watch cache: right after a
    CRD is (re)created it answers 429 "storage is (re)initializing" for a while, and kopf backs off
    on that, which would look like a missing watch to the timed steps."""
    def ready(path: str) -> bool:
        try:
            kube.request("GET", path, query=[("resourceVersion", "0"), ("limit", "1")])
            return True
        except ApiError as exc:
            if exc.status in (429, 404):
                return False
            raise
    for path in WATCHED_PATHS:
        if path.endswith(skip):
            continue
        wait_for(lambda: ready(path), 60, f"watch cache of {path}")


@dataclass
class Identity:
    """A service account of its own with a minted token (TokenRequest), bound to one ClusterRole."""

    name: str
    kubeconfig: Path
    api: client.ApiClient


def mint_identity(cp: ControlPlane, admin_api: client.ApiClient, name: str, rules: list[dict[str, Any]],
                  lease_rules: list[dict[str, Any]], directory: Path) -> Identity:
    """ServiceAccount kimik3-system/<name>, ClusterRole + ClusterRoleBinding <name> with ``rules``,
    Role + RoleBinding kimik3-system/<name> with ``lease_rules`` for the Lease named <name>, and a
    kubeconfig with a real service-account token the API server signed for it."""
    core, rbac = client.CoreV1Api(admin_api), client.RbacAuthorizationV1Api(admin_api)
    core.create_namespaced_service_account(RELEASE_NAMESPACE, {"metadata": {"name": name}})
    meta = {"name": name, "labels": {"kimik3.io/test": "rbac-minimal"}}
    subjects = [{"kind": "ServiceAccount", "name": name, "namespace": RELEASE_NAMESPACE}]
    rbac.create_cluster_role({"metadata": meta, "rules": rules})
    rbac.create_cluster_role_binding({
        "metadata": meta, "subjects": subjects,
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name}})
    rbac.create_namespaced_role(RELEASE_NAMESPACE, {"metadata": meta, "rules": [
        {**r, "resourceNames": [name]} if r.get("resourceNames") else r for r in lease_rules]})
    rbac.create_namespaced_role_binding(RELEASE_NAMESPACE, {
        "metadata": meta, "subjects": subjects,
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name}})
    token, _ = request_token(admin_api, RELEASE_NAMESPACE, name, lifetime_s=3600)
    kubeconfig = write_token_kubeconfig(directory / f"{name}.kubeconfig", cp.server, cp.ca_file, name, token)
    return Identity(name, kubeconfig, config.new_client_from_config(config_file=str(kubeconfig)))


def drop_identity(admin_api: client.ApiClient, identity: Identity) -> None:
    identity.api.close()
    rbac = client.RbacAuthorizationV1Api(admin_api)
    for call in (lambda: rbac.delete_cluster_role_binding(identity.name), lambda: rbac.delete_cluster_role(identity.name),
                 lambda: rbac.delete_namespaced_role_binding(identity.name, RELEASE_NAMESPACE),
                 lambda: rbac.delete_namespaced_role(identity.name, RELEASE_NAMESPACE),
                 lambda: Kube(admin_api).delete(LEASE.api_version, LEASE.kind, RELEASE_NAMESPACE, identity.name),
                 lambda: client.CoreV1Api(admin_api).delete_namespaced_service_account(identity.name,
                                                                                       RELEASE_NAMESPACE)):
        try:
            call()
        except (ApiException, ApiError):
            pass


def run_scenario(args: list[str], kubeconfig: Path, kube: Kube, admin_api: client.ApiClient, log_path: Path,
                 namespace: str, late_crd: bool = False, cp: ControlPlane | None = None) -> tuple[str | None, str]:
    """Start the operator with ``args`` (the chart's Deployment command) and ``kubeconfig``, run the
    scenario in ``namespace``; return the first broken behaviour (None: all happened) and the log.
    The operator's Lease (``--leader-election-name`` of ``args``) is deleted first: a killed
    predecessor would hold it for a lease duration."""
    lease = next(a.split("=", 1)[1] for a in args if a.startswith("--leader-election-name="))
    kube.delete(LEASE.api_version, LEASE.kind, RELEASE_NAMESPACE, lease)
    ext = client.ApiextensionsV1Api(admin_api)
    if late_crd:
        ext.delete_custom_resource_definition(HTTPROUTE_CRD)
        wait_for(lambda: HTTPROUTE_CRD not in {c.metadata.name for c in ext.list_custom_resource_definition().items},
                 30, "HTTPRoute CRD deleted")
    op = OperatorProcess(args, kubeconfig, log_path, ready_timeout_s=90)
    try:
        plant_canaries(kube, client.CoreV1Api(admin_api), namespace)
        try:
            op.start()
        except AssertionError as exc:
            return "operator ready", str(exc)
        await_first_listings(op)
        if late_crd:
            assert cp is not None
            cp.apply_crds([thirdparty_crd_paths()["HTTPRoute"]])
            warm_watch_caches(kube)
            wait_for(lambda: "HTTPRoute (gateway.networking.k8s.io/v1) is served now" in op.log(), 4 * PERIOD_S,
                     "the operator's discovery look-up of the HTTPRoute kind (controller/lateapis.py)")
        try:
            scenario(kube, client.CoreV1Api(admin_api), namespace, lease)
            if late_crd:
                survive_crd_removal(ext, op)
            return None, op.log()
        except Broken as broken:
            return broken.behaviour, f"{broken}\n--- operator log ---\n{op.log()[-4000:]}"
    finally:
        op.kill()
        cleanup(kube, namespace)
        if late_crd and HTTPROUTE_CRD not in {c.metadata.name for c in ext.list_custom_resource_definition().items}:
            assert cp is not None
            cp.apply_crds([thirdparty_crd_paths()["HTTPRoute"]])


SURVIVE_S = 10.0
"""The operator must still be running and healthy this long after a watched kind's CRD is deleted
(without lateapis.tolerate_unserved_kinds, kopf's failed watcher stopped it ~3 s after the deletion)."""


def survive_crd_removal(ext: client.ApiextensionsV1Api, op: OperatorProcess) -> None:
    ext.delete_custom_resource_definition(HTTPROUTE_CRD)
    deadline = time.monotonic() + SURVIVE_S
    while time.monotonic() < deadline:
        if op.proc is None or op.proc.poll() is not None or http_status(f"{op.url}/healthz", timeout=2) != 200:
            raise Broken("survive CRD removal", f"the operator stopped or is unhealthy after the HTTPRoute CRD "
                         f"was deleted:\n{op.log()[-3000:]}")
        time.sleep(0.5)
    wait_for(lambda: HTTPROUTE_CRD not in {c.metadata.name for c in ext.list_custom_resource_definition().items},
             30, "HTTPRoute CRD deleted")  # gone, so the caller's cleanup installs it again


HARNESS_ERROR = "harness error"
Job = tuple[str, str] | None  # (resource, verb) taken away; None = the full ClusterRole


@pytest.fixture(scope="module")
def results(helm: Helm, chart_cp: ControlPlane, admin_api: client.ApiClient,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[tuple[Job, bool], tuple[str | None, str]]]:
    """Install the chart; run the scenario once per job; yield {(job, late_crd): (broken, log)}.

    Namespaced behaviours run in parallel: each job gets a service account of its own (a token the
    API server mints) bound to the chart's ClusterRole less one verb, and its operator watches one
    namespace of its own (the chart's command plus --namespace). The late-CRD variant runs
    afterwards, once, cluster-wide as the chart installed it: the chart's own ServiceAccount token
    and ClusterRole."""
    assert min(RESYNC_READY_S, RESYNC_STARTING_S) > 4 * HEAL_WINDOW_S, (
        "the timed steps tell a watch from the operator's periodic resync: keep the resync periods "
        f"well above {HEAL_WINDOW_S} s or widen HEAL_WINDOW_S")
    kube = Kube(admin_api)
    uninstall_if_present(helm)
    helm.run("install", RELEASE, str(CHART), "--namespace", RELEASE_NAMESPACE)
    create_priority_classes(admin_api, RESERVED_CLASS, BURST_CLASS)
    rules = clusterrole_rules(admin_api)
    lease_rules = [admin_api.sanitize_for_serialization(r) for role in (LEASE_ROLE, WAKE_ROLE) for r in
                   client.RbacAuthorizationV1Api(admin_api).read_namespaced_role(role, RELEASE_NAMESPACE).rules]
    args = deployment_args(admin_api)
    directory = tmp_path_factory.mktemp("rbac-minimal")
    warm_watch_caches(kube)
    out: dict[tuple[Job, bool], tuple[str | None, str]] = {}

    def namespaced(index: int, job: Job) -> tuple[str | None, str]:
        try:
            taken = job or (None, None)
            lease_job = (taken[0], taken[1]) in NAMESPACED_EXPECTED
            identity = mint_identity(chart_cp, admin_api, f"rbac-{index}", rules if lease_job else without(rules, *taken),
                                     without(lease_rules, *taken) if lease_job else lease_rules, directory)
            try:
                if job is not None and not lease_job:
                    group = group_of(rules, job[0])
                    wait_for(lambda: not allowed(identity.api, group, *job), 30, f"{job} revoked")
                namespace = make_namespace(admin_api, f"rbac-{index}-{uuid.uuid4().hex[:6]}")
                own = [a for a in args if not a.startswith("--leader-election-name=")]
                return run_scenario([*own, f"--leader-election-name={identity.name}", f"--namespace={namespace}"],
                                    identity.kubeconfig, kube, admin_api,
                                    directory / f"rbac-{index}.log", namespace)
            finally:
                drop_identity(admin_api, identity)
        except Exception:  # the harness itself failed: reported by this job's test, not all of them
            return HARNESS_ERROR, traceback.format_exc()

    try:
        jobs: list[Job] = [None, *sorted(EXPECTED), *sorted(NAMESPACED_EXPECTED)]
        with ThreadPoolExecutor(max_workers=PARALLEL) as pool:
            futures = {job: pool.submit(namespaced, i, job) for i, job in enumerate(jobs)}
            for job, future in futures.items():
                out[(job, False)] = future.result()
        try:  # the late-CRD baseline: cluster-wide, the chart's own ServiceAccount and ClusterRole
            namespace = make_namespace(admin_api, f"rbac-late-{uuid.uuid4().hex[:6]}")
            out[(None, True)] = run_scenario(args, chart_cp.operator_kubeconfig, kube, admin_api,
                                             directory / "late.log", namespace, late_crd=True, cp=chart_cp)
        except Exception:
            out[(None, True)] = HARNESS_ERROR, traceback.format_exc()
        yield out
    finally:
        uninstall_if_present(helm)


@pytest.mark.parametrize("kind, name, expected", [("ClusterRole", RELEASE, EXPECTED), ("Role", LEASE_ROLE, LEASE_EXPECTED),
                                                  ("Role", WAKE_ROLE, WAKE_EXPECTED)],
                         ids=["clusterrole", "leader-election-role", "wake-role"])
def test_every_rule_has_a_named_behaviour(helm_offline, kind, name, expected):
    (role,) = [d for d in helm_offline.template() if d["kind"] == kind and d["metadata"]["name"] == name]
    granted = {(r["resources"][0], v) for r in role["rules"] for v in r["verbs"]}
    assert granted == set(expected), (
        f"rules without a behaviour here: {sorted(granted - set(expected))}; "
        f"behaviours whose rule the chart lacks: {sorted(set(expected) - granted)}")
    for rule in role["rules"]:
        assert len(rule["resources"]) == 1 and "*" not in rule["verbs"] + rule["resources"] + rule["apiGroups"]


@pytest.mark.parametrize("late_crd", [False, True], ids=["namespaced-crds-first", "cluster-wide-late-crd"])
def test_baseline_every_behaviour_happens_under_the_chart_rbac(results, late_crd):
    broken, log = results[(None, late_crd)]
    assert broken != HARNESS_ERROR, log
    assert broken is None, log


@pytest.mark.parametrize("resource,verb", sorted({**EXPECTED, **NAMESPACED_EXPECTED}),
                         ids=[f"{r}-{v}" for r, v in sorted({**EXPECTED, **NAMESPACED_EXPECTED})])
def test_removing_one_verb_breaks_its_behaviour(results, resource, verb):
    broken, log = results[((resource, verb), False)]
    assert broken != HARNESS_ERROR, log
    assert broken is not None, f"nothing broke without {verb} on {resource}: the rule should go"
    assert broken == {**EXPECTED, **NAMESPACED_EXPECTED}[(resource, verb)], log
