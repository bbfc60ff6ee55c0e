"""``kimik3.kube.pods`` / ``nodes`` / ``objects``: what a pod's labels and status mean, for objects
as the API's JSON (plain dicts, camelCase keys; read-only views of them pass too, as kopf hands
bodies)."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

from kimik3.kube import nodes, pods, workloads
from kimik3.kube.objects import condition, is_deleting, is_true, labels, meta

LWS = "leaderworkerset.sigs.k8s.io"
SCHEDULER_MESSAGE = ("0/12 nodes are available: 4 node(s) didn't match pod anti-affinity rules, "
                     "8 Insufficient nvidia.com/gpu. preemption: 0/12 nodes are available.")


def pod(name: str = "k3-latency-engine-1", group: str | None = "1", worker: str | None = "0",
        phase: str | None = "Running", conditions: list[dict[str, Any]] | None = None,
        deleting: bool = False) -> dict[str, Any]:
    pod_labels = {f"{LWS}/name": "k3-latency-engine"}
    if group is not None:
        pod_labels[f"{LWS}/group-index"] = group
    if worker is not None:
        pod_labels[f"{LWS}/worker-index"] = worker
    metadata: dict[str, Any] = {"name": name, "namespace": "inference", "labels": pod_labels}
    if deleting:
        metadata["deletionTimestamp"] = "2026-11-29T08:00:00Z"
    status: dict[str, Any] = {}
    if phase is not None:
        status["phase"] = phase
    if conditions is not None:
        status["conditions"] = conditions
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": {}, "status": status}


READY = {"type": "Ready", "status": "True", "lastTransitionTime": "2026-11-29T07:59:00Z"}
NOT_READY = {"type": "Ready", "status": "False", "reason": "ContainersNotReady",
             "message": "containers with unready status: [engine]"}
SCHEDULED = {"type": "PodScheduled", "status": "True"}
UNSCHEDULABLE = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                 "message": f"  {SCHEDULER_MESSAGE}\n"}
GATED = {"type": "PodScheduled", "status": "False", "reason": "SchedulingGated",
         "message": "Scheduling is blocked due to non-empty scheduling gates"}


def test_leader_worker_and_group_from_the_lws_labels() -> None:
    leader = pod(worker="0", group="3")
    worker = pod(name="k3-latency-engine-3-1", worker="1", group="3")
    loose = pod(name="debug", worker=None, group=None)
    assert (pods.is_leader(leader), pods.role(leader), pods.group_index(leader), pods.worker_index(leader)) == \
        (True, "leader", "3", 0)
    assert (pods.is_leader(worker), pods.role(worker), pods.group_index(worker), pods.worker_index(worker)) == \
        (False, "worker", "3", 1)
    assert (pods.is_leader(loose), pods.group_index(loose), pods.worker_index(loose)) == (False, None, None)
    assert pods.labels(leader)[f"{LWS}/name"] == "k3-latency-engine"
    assert pods.labels({"metadata": {"name": "bare"}}) == {} and pods.labels({}) == {}


def test_ready_needs_condition_ready_true_and_no_deletion() -> None:
    assert pods.is_ready(pod(conditions=[SCHEDULED, READY]))
    assert pods.ready_since(pod(conditions=[SCHEDULED, READY])) == "2026-11-29T07:59:00Z"
    assert not pods.is_ready(pod(conditions=[SCHEDULED, NOT_READY]))
    assert pods.ready_since(pod(conditions=[SCHEDULED, NOT_READY])) is None
    assert not pods.is_ready(pod(conditions=None, phase="Pending"))
    terminating = pod(conditions=[SCHEDULED, READY], deleting=True)
    assert pods.is_terminating(terminating) and is_deleting(terminating)
    assert not pods.is_ready(terminating)  # probes said Ready last, but the pod is going
    assert not pods.is_terminating(pod(conditions=[READY]))


def test_unschedulable_is_podscheduled_false_reason_unschedulable_and_not_terminating() -> None:
    pending = pod(phase="Pending", conditions=[UNSCHEDULABLE])
    assert pods.is_unschedulable(pending)
    assert pods.unschedulable_message(pending) == SCHEDULER_MESSAGE
    assert pods.scheduling_problem(pending) == f"Unschedulable: {SCHEDULER_MESSAGE}"
    assert pods.phase(pending) == "Pending"
    gated = pod(phase="Pending", conditions=[GATED])
    assert not pods.is_unschedulable(gated) and pods.unschedulable_message(gated) == ""
    assert pods.scheduling_problem(gated) == "SchedulingGated: Scheduling is blocked due to non-empty scheduling gates"
    deleted = pod(phase="Pending", conditions=[UNSCHEDULABLE], deleting=True)
    assert not pods.is_unschedulable(deleted)  # the scheduler no longer tries to place it
    placed = pod(conditions=[SCHEDULED, READY])
    assert not pods.is_unschedulable(placed) and pods.scheduling_problem(placed) == ""
    fresh = pod(phase=None, conditions=None)  # just created: the scheduler has not looked
    assert (pods.is_unschedulable(fresh), pods.scheduling_problem(fresh), pods.phase(fresh)) == (False, "", None)


def test_spec_fields_node_gates_and_gpus() -> None:
    bound = pod()
    bound["spec"] = {"nodeName": "gb300-r0-t00", "schedulingGates": [{"name": "kueue.x-k8s.io/admission"}],
                     "containers": [{"name": "engine", "resources": {"limits": {"nvidia.com/gpu": "4"}}}]}
    assert pods.node_name(bound) == "gb300-r0-t00" and pods.holds_node(bound)
    assert pods.scheduling_gates(bound) == ["kueue.x-k8s.io/admission"]
    assert pods.gpu_request(bound) == 4
    assert (pods.node_name(pod()), pods.scheduling_gates(pod()), pods.gpu_request(pod())) == ("", [], 0)
    finished = {**bound, "status": {"phase": "Succeeded"}}
    assert not pods.holds_node(finished)


def test_condition_finds_one_type() -> None:
    disrupted = {"type": "DisruptionTarget", "status": "True", "reason": "DeletionByTaintManager",
                 "message": "Taint manager: deleting due to NoExecute taint"}
    found = pods.condition(pod(conditions=[SCHEDULED, READY, disrupted]), pods.DISRUPTION_TARGET)
    assert found is not None and found["reason"] == "DeletionByTaintManager"
    assert pods.condition(pod(conditions=[SCHEDULED, READY]), "ContainersReady") is None
    assert condition(None, "Ready") is None and not is_true(None, "Ready")  # an object a read did not find


def test_read_only_views_read_like_dicts() -> None:
    """kopf hands handlers read-only mappings, not dicts: every helper reads them the same way."""
    def frozen(value: Any) -> Any:
        if isinstance(value, dict):
            return MappingProxyType({k: frozen(v) for k, v in value.items()})
        return [frozen(v) for v in value] if isinstance(value, list) else value

    view = frozen({**pod(conditions=[SCHEDULED, READY]), "metadata": {
        **pod()["metadata"], "annotations": {"kueue.x-k8s.io/component-workload-index": "1"}}})
    assert pods.is_ready(view) and pods.is_leader(view) and pods.group_index(view) == "1"
    assert meta(view)["name"] == "k3-latency-engine-1" and labels(view)[f"{LWS}/worker-index"] == "0"
    assert workloads.group_index(view) == "1" and workloads.group_index(pod()) == "?"


def test_node_ready_reads_the_kubelet_condition() -> None:
    def node(status: str | None, unschedulable: bool = False) -> dict[str, Any]:
        conditions = None if status is None else [
            {"type": "MemoryPressure", "status": "False"},
            {"type": "Ready", "status": status, "reason": "KubeletReady" if status == "True" else "NodeStatusUnknown"}]
        status_: dict[str, Any] = {"allocatable": {"nvidia.com/gpu": "4"}}
        if conditions is not None:
            status_["conditions"] = conditions
        return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gb300-r0-t00", "labels": {"rack": "r0"}},
                "spec": {"unschedulable": True} if unschedulable else {}, "status": status_}
    assert nodes.is_ready(node("True")) and nodes.is_schedulable(node("True"))
    assert not nodes.is_schedulable(node("True", unschedulable=True))
    for status in ("False", "Unknown", None):
        assert not nodes.is_ready(node(status))
    ready = node("True")
    assert (nodes.name(ready), nodes.labels(ready), nodes.allocatable_gpus(ready)) == \
        ("gb300-r0-t00", {"rack": "r0"}, 4)
