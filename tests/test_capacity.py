"""Reserved and burst capacity (issue 28 item 4, ``controller.capacity``): which groups are
reserved, the class the LeaderWorkerSet carries, the Workload priorities the operator writes, what
status.groups and the Events say; then on a real API server (no Kueue manager: the Workloads put
as Kueue v0.19.2 creates them, at the set's class) the Reconciler raises the reserved group's.
With the real Kueue manager and a full cluster: tests/e2e/test_e2e_kueue.py."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client

from kimik3.admission import admit
from kimik3.api.errors import SpecErrors
from kimik3.api.v1alpha1 import GroupStatus
from kimik3.controller.capacity import Priorities, capacity_of, missing_reserved, reprioritizations, reserved_groups
from kimik3.controller.fleet import engine_sets
from kimik3.controller.groups import group_statuses, kueue_changes
from kimik3.kube.groups import BURST, RESERVED
from kimik3.kube.labels import CAPACITY_ANNOTATION
from support.kueue import create_priority_classes, put_workload
from support.recipes import recipe
from support.rendering import by_kind, render_cr

UID = "0b1c2d3e-0000-4000-8000-000000000001"
PLACEMENT = {"mode": "kueue", "queueName": "default", "priorityClass": "tenant-reserved",
             "burstPriorityClass": "tenant-burst"}
PRIORITIES = Priorities(reserved=1000, burst=100)
BURST_CLASS = ("tenant-burst", 100)
"""The class a set labelled burst has its Workloads created at (Kueue v0.19.2)."""
SCRAPE = {"metricsSource": {"type": "podScrape"}}
"""Autoscaling reads the leaders' /metrics (none here: it holds the groups it has)."""


def spec(autoscaling: dict[str, Any] | None = None, **placement: Any) -> Any:
    body = recipe(replicas=3, scheduling={"placement": {**PLACEMENT, **placement}},
                  autoscaling={**SCRAPE, **(autoscaling or {"enabled": True, "minReplicas": 1, "maxReplicas": 3})})
    return admit(body["spec"]).spec


def workload(index: int, priority: int | None = 100, capacity: str | None = None, lws_uid: str = "lws-1",
             name: str = "") -> dict[str, Any]:
    annotations = {"kueue.x-k8s.io/component-workload-index": str(index)}
    if capacity:
        annotations[CAPACITY_ANNOTATION] = capacity
    return {"metadata": {"name": name or f"leaderworkerset-k3-latency-engine-{index}-x", "uid": f"uid-{index}",
                         "labels": {"kueue.x-k8s.io/job-uid": lws_uid}, "annotations": annotations},
            "spec": {"priorityClassRef": {"group": "kueue.x-k8s.io", "kind": "WorkloadPriorityClass",
                                          "name": "tenant-burst"}, "priority": priority}}


def test_the_reserved_groups_are_min_replicas_with_autoscaling_and_every_group_without():
    assert reserved_groups(spec()) == 1
    assert reserved_groups(spec({"enabled": False})) == 3  # a fixed replicas is all reserved
    assert reserved_groups(spec(burstPriorityClass=None)) is None  # nothing told apart
    assert [capacity_of(1, i) for i in range(3)] == [RESERVED, BURST, BURST]
    assert capacity_of(None, 0) is None


def test_the_leaderworkerset_carries_the_burst_class_and_without_one_the_priority_class():
    """Every Workload Kueue makes starts at the set's class: with burst capacity the lower one, so
    no group preempts at the reserved priority before the operator knows it is reserved."""
    def label(placement: dict[str, Any]) -> str | None:
        lws = by_kind(render_cr(recipe(uid=UID, scheduling={"placement": placement})).objects, "LeaderWorkerSet")
        return lws["metadata"]["labels"].get("kueue.x-k8s.io/priority-class")
    assert label(PLACEMENT) == "tenant-burst"
    assert label({**PLACEMENT, "burstPriorityClass": None}) == "tenant-reserved"


@pytest.mark.parametrize("placement", [{"priorityClass": None}, {"priorityClass": "tenant-burst"}])
def test_a_burst_class_needs_a_different_priority_class_and_the_error_names_the_fix(placement):
    body = recipe(scheduling={"placement": {**PLACEMENT, **placement}})
    with pytest.raises(SpecErrors) as err:
        admit(body["spec"])
    (problem,) = [e for e in err.value.errors if "burstPriorityClass" in e.path]
    assert problem.path == "spec.scheduling.placement.burstPriorityClass"
    assert "set priorityClass to that class (not burstPriorityClass's), or remove burstPriorityClass" in str(problem)


def test_the_reserved_group_is_raised_a_burst_one_only_annotated_and_one_no_longer_reserved_lowered():
    sets = {"lws-1": "k3-latency-engine"}
    changes = reprioritizations(spec(), [
        workload(0),                                   # reserved, at the burst value Kueue gave it: raised
        workload(1),                                   # burst, as created: the annotation alone
        workload(2, priority=1000, capacity=RESERVED),  # was reserved (minReplicas fell): lowered
        workload(3, capacity=BURST),                   # burst and said so: nothing
        workload(0, lws_uid="other", name="other-0"),  # another deployment's set: not ours
    ], sets, PRIORITIES)
    assert [(c.workload[-3:], c.capacity, c.priority) for c in changes] == [
        ("0-x", RESERVED, 1000), ("1-x", BURST, 100), ("2-x", BURST, 100)]
    raised, annotated, lowered = changes
    assert raised.patch() == {"metadata": {"uid": "uid-0", "annotations": {CAPACITY_ANNOTATION: RESERVED}},
                              "spec": {"priority": 1000}}
    assert raised.event is not None and raised.event.message == (
        "group 0 of LeaderWorkerSet k3-latency-engine is reserved capacity: its Workload's priority set to 1000 "
        "(WorkloadPriorityClass tenant-reserved, was 100), never preempted for another tenant's burst")
    assert annotated.event is None
    assert lowered.event is not None and "burst capacity: its Workload's priority set to 100 (WorkloadPriorityClass " \
        "tenant-burst, was 1000), preemptible by another tenant's reserved groups" in lowered.event.message
    # with minReplicas 3 every group is reserved
    assert [c.priority for c in reprioritizations(spec({"enabled": True, "minReplicas": 3, "maxReplicas": 3}),
                                                  [workload(0), workload(2)], sets, PRIORITIES)] == [1000, 1000]


def test_a_reserved_group_without_a_workload_yet_is_looked_at_again():
    lws = {"metadata": {"name": "k3-latency-engine", "uid": "lws-1"}, "spec": {"replicas": 3}}
    sets = engine_sets([lws], {})
    assert missing_reserved(spec(), [], sets)
    assert not missing_reserved(spec(), [workload(0)], sets)  # the burst groups' Workloads need no raise
    assert missing_reserved(spec({"enabled": True, "minReplicas": 2, "maxReplicas": 3}), [workload(0)], sets)
    assert not missing_reserved(spec(burstPriorityClass=None), [], sets)


def test_status_groups_say_reserved_or_burst_and_the_preemption_event_names_it():
    lws = {"metadata": {"name": "k3-latency-engine", "uid": "lws-1"}, "spec": {"replicas": 2}}
    sets = engine_sets([lws], {})
    preempted = {**workload(1), "status": {"conditions": [
        {"type": "Evicted", "status": "True", "reason": "Preempted",
         "message": "Preempted to accommodate a workload (UID: b0) due to reclamation within the cohort"}]}}
    admitted = {**workload(0), "status": {"conditions": [{"type": "Admitted", "status": "True"}]}}
    after = group_statuses({}, [admitted, preempted], sets, sets[0], 2, reserved=1)
    assert [(g.index, g.capacity, g.kueue) for g in after] == [(0, RESERVED, "Admitted"), (1, BURST, "Preempted")]
    before = [GroupStatus(leader_worker_set="k3-latency-engine", index=1, kueue="Admitted", capacity=BURST)]
    (event,) = [e for e in kueue_changes(before, after) if e.reason == "GroupPreempted"]
    assert event.message.startswith("group 1 (burst) preempted by Kueue (was Admitted): Preempted to accommodate")
    # without burst capacity nothing is said
    assert [g.capacity for g in group_statuses({}, [admitted], sets, sets[0], 1)] == [None]


# ------------------------------------------------------------------ on a real API server -----


@pytest.fixture
def priority_classes(admin_api: client.ApiClient, kueue_queue: str) -> None:
    """The tenant's two WorkloadPriorityClasses (cluster-scoped; left for later tests, made once)."""
    create_priority_classes(admin_api, ("tenant-reserved", 1000), BURST_CLASS)


@pytest.mark.usefixtures("priority_classes")
def test_the_reconciler_raises_the_reserved_groups_workload_and_says_so(kube, admin_api, namespace):
    from kimik3.controller.reconcile import Reconciler
    from kimik3.controller.capacity import RECHECK_S
    from kimik3.controller.steps import REPLACE_POLL_S
    from support.cluster import CR, LWS, apply

    rec = Reconciler(kube)
    apply(kube, recipe(replicas=3, scheduling={"placement": PLACEMENT},
                       autoscaling={"enabled": True, "minReplicas": 1, "maxReplicas": 3, **SCRAPE}), namespace)
    for _ in range(3):  # the finalizer, WeightsReady announced, then the engines
        rec.reconcile(namespace, "k3-latency")
    lws = kube.get(*LWS, namespace, "k3-latency-engine")
    assert lws["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] == "tenant-burst"
    # group 0's Workload not made yet (Kueue makes it a moment after the set): looked at again soon
    assert rec.reconcile(namespace, "k3-latency").requeue_after == REPLACE_POLL_S
    names = [put_workload(kube, namespace, lws["metadata"]["uid"], i, priority_class=BURST_CLASS)
             for i in range(lws["spec"]["replicas"])]
    rec.reconcile(namespace, "k3-latency")
    stored = [kube.get("kueue.x-k8s.io/v1beta2", "Workload", namespace, n) for n in names]
    assert [(w["spec"]["priority"], w["metadata"]["annotations"][CAPACITY_ANNOTATION]) for w in stored] == [
        (1000, RESERVED), *[(100, BURST)] * (len(names) - 1)]
    assert stored[0]["spec"]["priorityClassRef"]["name"] == "tenant-burst"  # the name Kueue keeps the value under
    obj = kube.get(*CR, namespace, "k3-latency")
    assert [(g["index"], g["capacity"]) for g in obj["status"]["groups"]] == [
        (0, RESERVED), *[(i, BURST) for i in range(1, len(names))]]
    messages = [e.message for e in client.CoreV1Api(admin_api).list_namespaced_event(namespace).items
                if e.reason == "GroupCapacity"]
    assert messages == ["group 0 of LeaderWorkerSet k3-latency-engine is reserved capacity: its Workload's priority "
                        "set to 1000 (WorkloadPriorityClass tenant-reserved, was 100), never preempted for another "
                        "tenant's burst"]
    settled = rec.reconcile(namespace, "k3-latency")  # nothing written again; looked at within RECHECK_S
    assert settled.requeue_after is not None and REPLACE_POLL_S < settled.requeue_after <= RECHECK_S
    assert kube.get("kueue.x-k8s.io/v1beta2", "Workload", namespace, names[0])["metadata"]["resourceVersion"] == \
        stored[0]["metadata"]["resourceVersion"]
    # Kueue's WorkloadPriorityClass controller sets the class's value back (on a manager restart): raised again
    kube.patch_merge("kueue.x-k8s.io/v1beta2", "Workload", namespace, names[0], {"spec": {"priority": 100}})
    rec.reconcile(namespace, "k3-latency")
    assert kube.get("kueue.x-k8s.io/v1beta2", "Workload", namespace, names[0])["spec"]["priority"] == 1000


@pytest.mark.usefixtures("priority_classes")
def test_a_missing_priority_class_is_named_and_no_priority_is_written(kube, admin_api, namespace):
    from kimik3.controller.reconcile import Reconciler
    from support.cluster import LWS, apply

    rec = Reconciler(kube)
    apply(kube, recipe(replicas=2, scheduling={"placement": {**PLACEMENT, "priorityClass": "no-such-class"}}),
          namespace)
    for _ in range(3):  # the finalizer, WeightsReady announced, then the engines
        rec.reconcile(namespace, "k3-latency")
    lws = kube.get(*LWS, namespace, "k3-latency-engine")
    name = put_workload(kube, namespace, lws["metadata"]["uid"], 0, priority_class=BURST_CLASS)
    rec.reconcile(namespace, "k3-latency")
    assert kube.get("kueue.x-k8s.io/v1beta2", "Workload", namespace, name)["spec"]["priority"] == 100
    messages = [e.message for e in client.CoreV1Api(admin_api).list_namespaced_event(namespace).items
                if e.reason == "PriorityClassUnreadable" and e.type == "Warning"]
    assert messages == ["WorkloadPriorityClass no-such-class not found (kubectl get workloadpriorityclasses): the "
                        "reserved groups keep the burst priority Kueue gave them until it can be read"]
