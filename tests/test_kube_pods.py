"""``kimik3.kube.pods`` / ``nodes`` / ``objects``: what a pod's labels and status mean, for the
API's JSON and for the ``kubernetes`` client's models alike (each case is checked in both forms:
the dict is what ``ApiClient.sanitize_for_serialization`` makes of the model, i.e. what the API
server sends)."""

from __future__ import annotations

import datetime as dt

import pytest
from kubernetes import client

from kimik3.kube import nodes, pods
from kimik3.kube.objects import condition, is_deleting

LWS = "leaderworkerset.sigs.k8s.io"
SCHEDULER_MESSAGE = ("0/12 nodes are available: 4 node(s) didn't match pod anti-affinity rules, "
                     "8 Insufficient nvidia.com/gpu. preemption: 0/12 nodes are available.")


def v1pod(name: str = "k3-latency-engine-1", group: str | None = "1", worker: str | None = "0",
          phase: str | None = "Running", conditions: list[client.V1PodCondition] | None = None,
          deleting: bool = False) -> client.V1Pod:
    labels = {f"{LWS}/name": "k3-latency-engine"}
    if group is not None:
        labels[f"{LWS}/group-index"] = group
    if worker is not None:
        labels[f"{LWS}/worker-index"] = worker
    meta = client.V1ObjectMeta(name=name, namespace="inference", labels=labels, deletion_timestamp=(
        dt.datetime(2026, 11, 29, 8, 0, tzinfo=dt.timezone.utc) if deleting else None))
    return client.V1Pod(metadata=meta, status=client.V1PodStatus(phase=phase, conditions=conditions))


def both(pod: client.V1Pod) -> list:
    """The pod as the client's model and as the API's JSON."""
    as_json = client.ApiClient().sanitize_for_serialization(pod)
    assert isinstance(as_json, dict) and "metadata" in as_json
    return [pod, as_json]


READY = client.V1PodCondition(type="Ready", status="True", last_transition_time=None)
NOT_READY = client.V1PodCondition(type="Ready", status="False", reason="ContainersNotReady",
                                  message="containers with unready status: [engine]")
SCHEDULED = client.V1PodCondition(type="PodScheduled", status="True")
UNSCHEDULABLE = client.V1PodCondition(type="PodScheduled", status="False", reason="Unschedulable",
                                      message=f"  {SCHEDULER_MESSAGE}\n")
GATED = client.V1PodCondition(type="PodScheduled", status="False", reason="SchedulingGated",
                              message="Scheduling is blocked due to non-empty scheduling gates")


@pytest.mark.parametrize("form", [0, 1], ids=["V1Pod", "json"])
def test_leader_worker_and_group_from_the_lws_labels(form: int) -> None:
    leader = both(v1pod(worker="0", group="3"))[form]
    worker = both(v1pod(name="k3-latency-engine-3-1", worker="1", group="3"))[form]
    loose = both(v1pod(name="debug", worker=None, group=None))[form]
    assert (pods.is_leader(leader), pods.role(leader), pods.group_index(leader), pods.worker_index(leader)) == \
        (True, "leader", "3", 0)
    assert (pods.is_leader(worker), pods.role(worker), pods.group_index(worker), pods.worker_index(worker)) == \
        (False, "worker", "3", 1)
    assert (pods.is_leader(loose), pods.group_index(loose), pods.worker_index(loose)) == (False, None, None)
    assert pods.labels(leader)[f"{LWS}/name"] == "k3-latency-engine"
    assert pods.labels({"metadata": {"name": "bare"}}) == {} and pods.labels(client.V1Pod()) == {}


@pytest.mark.parametrize("form", [0, 1], ids=["V1Pod", "json"])
def test_ready_needs_condition_ready_true_and_no_deletion(form: int) -> None:
    assert pods.is_ready(both(v1pod(conditions=[SCHEDULED, READY]))[form])
    assert not pods.is_ready(both(v1pod(conditions=[SCHEDULED, NOT_READY]))[form])
    assert not pods.is_ready(both(v1pod(conditions=None, phase="Pending"))[form])
    terminating = both(v1pod(conditions=[SCHEDULED, READY], deleting=True))[form]
    assert pods.is_terminating(terminating) and is_deleting(terminating)
    assert not pods.is_ready(terminating)  # probes said Ready last, but the pod is going
    assert not pods.is_terminating(both(v1pod(conditions=[READY]))[form])


@pytest.mark.parametrize("form", [0, 1], ids=["V1Pod", "json"])
def test_unschedulable_is_podscheduled_false_reason_unschedulable_and_not_terminating(form: int) -> None:
    pending = both(v1pod(phase="Pending", conditions=[UNSCHEDULABLE]))[form]
    assert pods.is_unschedulable(pending)
    assert pods.unschedulable_message(pending) == SCHEDULER_MESSAGE
    assert pods.scheduling_problem(pending) == f"Unschedulable: {SCHEDULER_MESSAGE}"
    assert pods.phase(pending) == "Pending"
    gated = both(v1pod(phase="Pending", conditions=[GATED]))[form]
    assert not pods.is_unschedulable(gated) and pods.unschedulable_message(gated) == ""
    assert pods.scheduling_problem(gated) == "SchedulingGated: Scheduling is blocked due to non-empty scheduling gates"
    deleted = both(v1pod(phase="Pending", conditions=[UNSCHEDULABLE], deleting=True))[form]
    assert not pods.is_unschedulable(deleted)  # the scheduler no longer tries to place it
    placed = both(v1pod(conditions=[SCHEDULED, READY]))[form]
    assert not pods.is_unschedulable(placed) and pods.scheduling_problem(placed) == ""
    fresh = both(v1pod(phase=None, conditions=None))[form]  # just created: the scheduler has not looked
    assert (pods.is_unschedulable(fresh), pods.scheduling_problem(fresh), pods.phase(fresh)) == (False, "", None)


@pytest.mark.parametrize("form", [0, 1], ids=["V1Pod", "json"])
def test_condition_finds_one_type(form: int) -> None:
    disrupted = client.V1PodCondition(type="DisruptionTarget", status="True", reason="DeletionByTaintManager",
                                      message="Taint manager: deleting due to NoExecute taint")
    pod = both(v1pod(conditions=[SCHEDULED, READY, disrupted]))[form]
    found = pods.condition(pod, pods.DISRUPTION_TARGET)
    reason = found["reason"] if isinstance(found, dict) else found.reason
    assert reason == "DeletionByTaintManager"
    assert pods.condition(pod, "ContainersReady") is None
    assert condition(None, "Ready") is None


def test_node_ready_reads_the_kubelet_condition() -> None:
    def v1node(status: str | None) -> client.V1Node:
        conditions = None if status is None else [
            client.V1NodeCondition(type="MemoryPressure", status="False"),
            client.V1NodeCondition(type="Ready", status=status, reason="KubeletReady" if status == "True"
                                   else "NodeStatusUnknown")]
        return client.V1Node(metadata=client.V1ObjectMeta(name="gb300-r0-t00"),
                             status=client.V1NodeStatus(conditions=conditions))
    for node in (v1node("True"), client.ApiClient().sanitize_for_serialization(v1node("True"))):
        assert nodes.is_ready(node)
    for status in ("False", "Unknown", None):
        assert not nodes.is_ready(v1node(status))
        assert not nodes.is_ready(client.ApiClient().sanitize_for_serialization(v1node(status)))
