"""Placement kueue with a queue Kueue does not serve: no engine pod, and the CR says what is missing
(``controller.queues``, issue 24).

On a real kube-apiserver of this module's own, first without Kueue's API (its CRDs not installed),
then with it: no LocalQueue; a LocalQueue whose ClusterQueue Kueue says does not exist; one whose
ClusterQueue is inactive; one Kueue reports active while no Kueue webhook is registered (this API
server has none: the dry run of the LeaderWorkerSet comes back unmarked). Each time the reconcile
creates no LeaderWorkerSet and no ComputeDomain (so no engine pod can exist), and the CR says
``Ready=False`` and ``ScalingLimited=True`` with a reason naming the missing object, a message with
the fix, and a Warning Event. A LocalQueue Kueue has not reported on holds nothing back; the groups
are then created, and ScalingLimited does not say "placed" for groups that do not exist yet. No
Kueue manager runs: the test writes the LocalQueue's status as Kueue v0.19.2's LocalQueue
controller does. The served path with Kueue's real webhooks: tests/e2e/test_e2e_kueue.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from kimik3.api.conditions import Reason
from kimik3.controller.fleet import EngineSet
from kimik3.controller.kube import Kube
from kimik3.controller.queues import QueueRead, creating, kueue_marked, queue_verdict
from kimik3.controller.reconcile import Reconciler
from kimik3.kube.kinds import COMPUTE_DOMAIN, LOCAL_QUEUE
from kimik3.kube.labels import KUEUE_SUSPENDING_PARENT_ANNOTATION
from kimik3.render.meta import engine_set_name
from kimik3_dev.devcluster import kueue
from kimik3_dev.devcluster.controlplane import ControlPlane
from kimik3_dev.devcluster.install import install_apis
from support.cluster import CR, LWS, apply, condition, serving_control_plane
from support.recipes import recipe

NAME, QUEUE = "k3-latency", "tenant"
ENGINE = engine_set_name(NAME)


# -- the verdict alone -------------------------------------------------------------------------


def local_queue(active: dict[str, str] | None) -> dict[str, Any]:
    obj = kueue.local_queue("ns", "gpus", QUEUE)
    if active is not None:
        obj["status"] = {"conditions": [{"type": "Active", **active}]}
    return obj


@pytest.mark.parametrize(("read", "reason", "says"), [
    (QueueRead(QUEUE, "ns", served=False), Reason.KUEUE_NOT_INSTALLED, "install Kueue v0.17.2 or later"),
    (QueueRead(QUEUE, "ns", refused="403 Forbidden: no"), Reason.QUEUE_UNREADABLE, "grant it get on localqueues"),
    (QueueRead(QUEUE, "ns"), Reason.LOCAL_QUEUE_MISSING, "LocalQueue tenant (namespace ns) does not exist: create it"),
    (QueueRead(QUEUE, "ns", local_queue({"status": "False", "reason": "ClusterQueueDoesNotExist", "message": "m"})),
     Reason.CLUSTER_QUEUE_MISSING, "points at ClusterQueue gpus, which does not exist (Kueue: m): create ClusterQueue gpus"),
    (QueueRead(QUEUE, "ns", local_queue({"status": "False", "reason": "ClusterQueueIsInactive", "message": "m"})),
     Reason.QUEUE_INACTIVE, "ClusterQueue gpus of LocalQueue tenant (namespace ns) is inactive (Kueue: m)"),
    (QueueRead(QUEUE, "ns", local_queue({"status": "False", "reason": "Stopped", "message": "LocalQueue is stopped"})),
     Reason.QUEUE_INACTIVE, "is not active (Kueue: Stopped: LocalQueue is stopped): e.g. remove its spec.stopPolicy"),
    (QueueRead(QUEUE, "ns", local_queue({"status": "True", "reason": "Ready", "message": "m"}), marked=False),
     Reason.KUEUE_WEBHOOK_MISSING, "came back without Kueue's kueue.x-k8s.io/pod-suspending-parent mark"),
])
def test_a_queue_kueue_does_not_serve_is_named_with_the_fix(read: QueueRead, reason: Reason, says: str) -> None:
    verdict = queue_verdict(read)
    assert verdict is not None and (verdict.status, verdict.reason) == ("True", reason)
    assert verdict.message.startswith("no group is created: ") and says in verdict.message, verdict.message


ACTIVE = {"status": "True", "reason": "Ready", "message": "Can submit new workloads to localQueue"}


@pytest.mark.parametrize(("active", "marked"), [(None, None), (ACTIVE, True), (ACTIVE, None)])
def test_a_served_queue_or_one_kueue_has_not_reported_on_holds_nothing(active: dict[str, str] | None,
                                                                      marked: bool | None) -> None:
    assert queue_verdict(QueueRead(QUEUE, "ns", local_queue(active), marked=marked)) is None


def test_only_an_apply_that_creates_groups_reads_the_queue() -> None:
    def lws(name: str, replicas: int) -> dict[str, Any]:
        return {"kind": "LeaderWorkerSet", "metadata": {"name": name}, "spec": {"replicas": replicas}}
    live = [EngineSet(lws("a", 2), "a", "h", 2, 2, False)]
    assert creating(live, [lws("a", 2), {"kind": "Service", "metadata": {"name": "a"}}]) is None
    assert creating(live, [lws("a", 1)]) is None  # fewer groups: nothing to create
    assert creating(live, [lws("a", 3)]) == lws("a", 3)
    assert creating(live, [lws("a", 2), lws("b", 1)]) == lws("b", 1)  # a rollout's new LeaderWorkerSet
    assert creating([], [lws("a", 1)]) == lws("a", 1)


def test_kueues_mark_on_every_pod_template() -> None:
    mark = {"metadata": {"annotations": {KUEUE_SUSPENDING_PARENT_ANNOTATION: "leaderworkerset.x-k8s.io/leaderworkerset"}}}

    def lws(leader: dict[str, Any] | None, worker: dict[str, Any]) -> dict[str, Any]:
        optional = {"leaderTemplate": leader} if leader is not None else {}
        return {"spec": {"leaderWorkerTemplate": {"workerTemplate": worker, **optional}}}
    assert kueue_marked(lws(mark, mark)) and kueue_marked(lws(None, mark))
    assert not kueue_marked(lws(mark, {"metadata": {}})) and not kueue_marked(lws({}, mark))


# -- the operator on a real API server ----------------------------------------------------------


@pytest.fixture(scope="module")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """A control plane of this module's own: the first test needs one without Kueue's API."""
    with serving_control_plane(Path(tmp_path_factory.mktemp("queue-control-plane")), install_apis) as cp:
        yield cp


@pytest.fixture(scope="module")
def admin_api(control_plane: ControlPlane) -> Iterator[client.ApiClient]:
    with control_plane.api_client("admin") as api:
        yield api


def held(kube: Kube, namespace: str, reason: Reason, *says: str) -> None:
    """Reconcile: no LeaderWorkerSet or ComputeDomain, Ready=False and ScalingLimited=True with
    ``reason`` and messages containing ``says``, and a Warning Event of that reason."""
    Reconciler(kube).reconcile(namespace, NAME)
    assert kube.get(*LWS, namespace, ENGINE) is None
    assert kube.get(*COMPUTE_DOMAIN.type_meta, namespace, NAME) is None
    obj = kube.get(*CR, namespace, NAME)
    limited, ready = condition(obj, "ScalingLimited"), condition(obj, "Ready")
    assert (limited["status"], limited["reason"]) == ("True", reason), limited
    assert (ready["status"], ready["reason"]) == ("False", reason), ready
    assert ready["message"].startswith("0/2 groups ready; no group is created: ")
    for text in says:
        assert text in limited["message"], limited["message"]
    warnings = [e for e in kube.list("v1", "Event", namespace, "") if e["reason"] == reason]
    assert [e["type"] for e in warnings] == ["Warning"] and warnings[0]["message"] == limited["message"]


def set_active(kube: Kube, namespace: str, status: str, reason: str, message: str) -> None:
    """The LocalQueue's ``Active`` condition, as Kueue's LocalQueue controller writes it."""
    kube.patch_merge(LOCAL_QUEUE.api_version, LOCAL_QUEUE.kind, namespace, QUEUE, {"status": {"conditions": [{
        "type": "Active", "status": status, "reason": reason, "message": message,
        "lastTransitionTime": "2026-12-04T00:00:00Z"}]}}, subresource="status")


def test_no_engine_pod_while_kueue_does_not_serve_the_queue(control_plane: ControlPlane, kube: Kube,
                                                            namespace: str) -> None:
    apply(kube, recipe(name=NAME, replicas=2, scheduling={"placement": {"mode": "kueue", "queueName": QUEUE}}),
          namespace)
    held(kube, namespace, Reason.KUEUE_NOT_INSTALLED, "does not serve Kueue's API (kueue.x-k8s.io/v1beta2)",
         "install Kueue v0.17.2 or later", "or set spec.scheduling.placement.mode: exclusive")

    control_plane.apply_crds(kueue.crd_documents(None))
    held(kube, namespace, Reason.LOCAL_QUEUE_MISSING, f"LocalQueue {QUEUE} (namespace {namespace}) does not exist",
         "set spec.scheduling.placement.queueName to a LocalQueue of this namespace")

    kube.apply(kueue.local_queue(namespace, "gpus", QUEUE))
    set_active(kube, namespace, "False", "ClusterQueueDoesNotExist", "Can't submit new workloads to clusterQueue")
    held(kube, namespace, Reason.CLUSTER_QUEUE_MISSING, "points at ClusterQueue gpus, which does not exist",
         "create ClusterQueue gpus")

    set_active(kube, namespace, "False", "ClusterQueueIsInactive", "Can't submit new workloads to clusterQueue")
    held(kube, namespace, Reason.QUEUE_INACTIVE, "ClusterQueue gpus of LocalQueue", "is inactive",
         "kubectl describe clusterqueue gpus")

    # Kueue reports the queue active, but no Kueue webhook is registered on this API server: the dry
    # run of the LeaderWorkerSet comes back unmarked
    set_active(kube, namespace, "True", "Ready", "Can submit new workloads to localQueue")
    held(kube, namespace, Reason.KUEUE_WEBHOOK_MISSING, "a dry run of the LeaderWorkerSet came back without Kueue's",
         "Register Kueue's webhooks")

    # a LocalQueue Kueue has not reported on (no manager): not held, the groups are created
    kube.patch_merge(LOCAL_QUEUE.api_version, LOCAL_QUEUE.kind, namespace, QUEUE, {"status": {"conditions": []}},
                     subresource="status")
    result = Reconciler(kube).reconcile(namespace, NAME)
    assert result.outcome == "applied"
    assert kube.get(*LWS, namespace, ENGINE)["spec"]["replicas"] == 2
    assert kube.get(*COMPUTE_DOMAIN.type_meta, namespace, NAME) is not None
    obj = kube.get(*CR, namespace, NAME)
    limited = condition(obj, "ScalingLimited")  # no LWS controller here: the groups are not created
    assert (limited["status"], limited["reason"]) == ("Unknown", "GroupsNotCreated"), limited
    assert limited["message"].startswith("0 of 2 groups exist"), limited["message"]
    assert condition(obj, "Ready")["reason"] == "GroupsNotReady"
