"""The status is built as the typed models (``KimiK3DeploymentStatus``) and written as their
camelCase JSON; conditions carry only the declared types and reasons (``kimik3.api.conditions``).
Pure functions: no cluster."""

from __future__ import annotations

import pytest

from kimik3.kube.groups import groups_of
from kimik3.controller.fleet import engine_sets
from kimik3.admission import admit
from kimik3.api.conditions import REASONS, ConditionType, Reason, Verdict
from kimik3.api.v1alpha1 import Condition, DecodeStatus, KimiK3DeploymentStatus, ScaleEvent
from kimik3.controller.status import (AutoscalerReport, invalid_status, merge_patch,
                                      set_condition, status_patch)
from kimik3.topology.capacity import Domain
from support import snapshots
from support.recipes import recipe

LWS = "leaderworkerset.sigs.k8s.io"


def cr(status: dict | None = None) -> dict:
    obj = recipe(uid="u1")
    obj["metadata"]["generation"] = 3
    if status is not None:
        obj["status"] = status
    return obj


def pod(name: str, group: str, worker: str, ready: bool = True, scheduled: dict | None = None) -> dict:
    conditions = [scheduled or {"type": "PodScheduled", "status": "True"}]
    if ready:
        conditions.append({"type": "Ready", "status": "True"})
    return {"metadata": {"name": name, "labels": {f"{LWS}/group-index": group, f"{LWS}/worker-index": worker,
                                                  f"{LWS}/name": name.rsplit("-", 1 if worker == "0" else 2)[0]}},
            "status": {"phase": "Running" if ready else "Pending", "conditions": conditions}}


def one_set(replicas: int, ready: int, pods: list[dict], name: str = "k3-latency-engine") -> list:
    """The deployment's one LeaderWorkerSet as ``compute_status`` takes it (LWS status counts)."""
    return engine_sets([{"metadata": {"name": name, "uid": "lws-uid"}, "spec": {"replicas": replicas},
                         "status": {"replicas": replicas, "readyReplicas": ready}}], groups_of(pods, 2))


def status_of(obj: dict, admitted, sets: list, pods: list[dict], desired: int, **kw):
    return snapshots.status(obj, admitted, sets, sets[-1] if sets else None, pods, desired, **kw)


def assert_declared(status: KimiK3DeploymentStatus) -> None:
    for c in status.conditions:
        assert c.reason in REASONS[ConditionType(c.type)], (c.type, c.reason)


def test_merge_patch_follows_rfc_7386() -> None:
    # RFC 7386, appendix A (a selection): objects merge, null removes, lists and scalars replace.
    target = {"title": "Goodbye!", "author": {"givenName": "John", "familyName": "Doe"}, "tags": ["example", "sample"],
              "content": "This will be unchanged"}
    patch = {"title": "Hello!", "phoneNumber": "+01-123-456-7890", "author": {"familyName": None}, "tags": ["example"]}
    assert merge_patch(target, patch) == {"title": "Hello!", "author": {"givenName": "John"}, "tags": ["example"],
                                          "content": "This will be unchanged", "phoneNumber": "+01-123-456-7890"}
    assert merge_patch({"a": "b"}, {"a": None}) == {}
    assert merge_patch({"a": [{"b": "c"}]}, {"a": [1]}) == {"a": [1]}


def test_status_patch_is_camel_case_and_writes_sub_objects_whole() -> None:
    status = KimiK3DeploymentStatus(
        observed_generation=3, ready_replicas=1, desired_replicas=2,
        decode=DecodeStatus(metric="interTokenLatency", percentile=95, latency_seconds=None,
                            acceptance_length=4.2, observed_at="2026-11-29T08:00:00Z"),
        last_scale=ScaleEvent.model_validate({"time": "2026-11-29T08:00:00Z", "from": 1, "to": 2,
                                              "reason": "ScaleUp: latency over target"}))
    patch = status_patch(status)
    assert patch == {
        "observedGeneration": 3, "conditions": [], "readyReplicas": 1, "desiredReplicas": 2,
        "decode": {"metric": "interTokenLatency", "percentile": 95, "latencySeconds": None, "aboveTopBucket": None,
                   "tokensPerSecondPerUser": None, "acceptanceLength": 4.2, "ttftSeconds": None,
                   "ttftPercentile": None, "observedAt": "2026-11-29T08:00:00Z"},
        "lastScale": {"time": "2026-11-29T08:00:00Z", "from": 1, "to": 2, "reason": "ScaleUp: latency over target"}}
    # What an earlier decision left in status.decode does not survive the patch; what the patch
    # leaves out (replicas, plan) stays as the CR holds it.
    stored = {"replicas": 1, "plan": {"gpusPerNode": 4},
              "decode": {"metric": "timePerOutputToken", "percentile": 90, "latencySeconds": 0.0051,
                         "tokensPerSecondPerUser": 196.1, "acceptanceLength": 4.0, "observedAt": "x"}}
    merged = merge_patch(stored, patch)
    assert merged["decode"] == {"metric": "interTokenLatency", "percentile": 95, "acceptanceLength": 4.2,
                                "observedAt": "2026-11-29T08:00:00Z"}
    assert (merged["replicas"], merged["plan"]) == (1, {"gpusPerNode": 4})
    assert DecodeStatus.model_validate(merged["decode"]) == status.decode


def test_set_condition_moves_the_transition_time_only_on_a_status_change() -> None:
    old = [Condition(type="Ready", status="False", reason="GroupsNotReady", message="0/1",
                     last_transition_time="2026-11-29T00:00:00Z", observed_generation=2),
           Condition(type="Degraded", status="False", reason="AsExpected", last_transition_time="2026-11-29T00:00:00Z")]
    same = set_condition(old, ConditionType.READY, Verdict("False", Reason.GROUPS_NOT_READY, "0/2"), 3)
    assert [c.type for c in same] == ["Degraded", "Ready"]  # sorted by type, one per type
    ready = same[1]
    assert (ready.message, ready.last_transition_time, ready.observed_generation) == ("0/2", "2026-11-29T00:00:00Z", 3)
    flipped = set_condition(same, ConditionType.READY, Verdict("True", Reason.ALL_GROUPS_READY, "2/2"), 3)[1]
    assert flipped.status == "True" and flipped.last_transition_time != "2026-11-29T00:00:00Z"
    long = set_condition([], ConditionType.DEGRADED, Verdict("True", Reason.APPLY_FAILED, "x" * 5000), None)[0]
    assert len(long.message) == 4096 and long.observed_generation is None


def test_reconciled_status_uses_declared_reasons_and_the_autoscaler_report() -> None:
    admitted = admit(cr()["spec"])
    pods = [pod("k3-latency-engine-0", "0", "0"), pod("k3-latency-engine-0-1", "0", "1"),
            pod("k3-latency-engine-1", "1", "0", ready=False, scheduled={
                "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                "message": "0/8 nodes are available: 8 Insufficient nvidia.com/gpu."})]
    decode = DecodeStatus(metric="timePerOutputToken", percentile=90, latency_seconds=0.0056,
                          tokens_per_second_per_user=178.6, acceptance_length=4.2, observed_at="2026-11-29T08:00:00Z")
    report = AutoscalerReport(2, decode, None, Verdict("True", Reason.MEASURED, "from 1 group(s)"))
    status = status_of(cr(), admitted, one_set(2, 1, pods), pods, 2, autoscaled=report)
    assert_declared(status)
    reasons = {c.type: (c.status, c.reason) for c in status.conditions}
    assert reasons == {"Ready": ("False", "GroupsNotReady"), "Progressing": ("True", "GroupsStarting"),
                       "ScalingLimited": ("True", "Unschedulable"), "Degraded": ("False", "AsExpected"),
                       "MetricsAvailable": ("True", "Measured")}
    assert all(c.observed_generation == 3 for c in status.conditions)
    assert (status.desired_replicas, status.decode, status.last_scale) == (2, decode, None)
    patch = status_patch(status)
    assert patch["decode"]["latencySeconds"] == 0.0056 and "lastScale" not in patch
    assert patch["plan"] == {"gpusPerNode": 4, "nodesPerGroup": 2, "gpusPerGroup": 8, "computeDomain": True,
                             "computeDomainNote": None}

    # Autoscaling off: the autoscaler's fields and MetricsAvailable are left as the CR holds them.
    plain = status_of(cr(patch), admitted, one_set(2, 2, pods[:2]), pods[:2], 2)
    assert_declared(plain)
    assert plain.condition("MetricsAvailable") == status.condition("MetricsAvailable")
    assert plain.desired_replicas is None and plain.decode is None
    again = status_patch(plain)
    assert not {"desiredReplicas", "decode", "lastScale"} & set(again)
    assert merge_patch(patch, again)["decode"] == patch["decode"]


@pytest.mark.parametrize("apply_error", [None, "LeaderWorkerSet k3-latency-engine: 500 Internal Server Error: "
                                               "failed calling webhook"])
def test_apply_failures_and_invalid_specs_use_declared_reasons(apply_error: str | None) -> None:
    admitted = admit(cr()["spec"])
    status = status_of(cr(), admitted, [], [], 1, apply_error=apply_error)
    assert_declared(status)
    degraded = status.condition(ConditionType.DEGRADED)
    assert degraded is not None
    assert (degraded.status, degraded.reason) == (("True", "ApplyFailed") if apply_error else ("False", "AsExpected"))
    refused = invalid_status(cr(status_patch(status)), "spec.topology: too few GPUs")
    assert_declared(refused)
    assert {c.type: (c.status, c.reason) for c in refused.conditions if c.reason == "InvalidSpec"} == {
        "Ready": ("False", "InvalidSpec"), "Progressing": ("False", "InvalidSpec"), "Degraded": ("True", "InvalidSpec")}
    assert refused.condition("ScalingLimited") == status.condition("ScalingLimited")  # not this writer's verdict
    assert status_patch(refused).keys() == {"observedGeneration", "conditions"}


def test_every_reason_belongs_to_a_condition_type() -> None:
    assert set(REASONS) == set(ConditionType)
    assert {r for reasons in REASONS.values() for r in reasons} == set(Reason)


def _workload(index: str, *conditions: dict) -> dict:
    return {"metadata": {"name": f"leaderworkerset-k3-engine-{index}-abcde",
                         "labels": {"kueue.x-k8s.io/job-uid": "lws-uid"},
                         "annotations": {"kueue.x-k8s.io/component-workload-index": index}},
            "status": {"conditions": list(conditions)}}


ADMITTED = {"type": "Admitted", "status": "True", "reason": "Admitted", "message": "The workload is admitted"}
QUOTA = {"type": "QuotaReserved", "status": "False", "reason": "Pending",
         "message": "couldn't assign flavors to pod set leader: insufficient unused quota for nvidia.com/gpu in "
                    "flavor gb300, 8 more needed"}
TOPOLOGY = {"type": "QuotaReserved", "status": "False", "reason": "Pending",
            "message": "couldn't assign flavors to pod set leader: topology \"nvl72\" doesn't allow to fit any of 2 pod(s)"}
PREEMPTED = {"type": "Evicted", "status": "True", "reason": "Preempted",
             "message": "Preempted to accommodate a workload (UID: 1) due to prioritization in the ClusterQueue"}


def test_kueue_limit_names_waiting_groups_once_and_quotes_kueue():
    from kimik3.controller.status import kueue_limit
    assert kueue_limit([_workload("0", ADMITTED), _workload("1", ADMITTED)], "q") is None
    v = kueue_limit([_workload("0", ADMITTED), _workload("2", QUOTA), _workload("1", QUOTA)], "q")
    assert (v.status, v.reason) == ("True", "QuotaExhausted")
    assert v.message.startswith("groups 1, 2 not admitted by Kueue (LocalQueue q); group 1: couldn't assign")
    assert v.message.count("insufficient unused quota") == 1  # one quote per kind, not per group
    v = kueue_limit([_workload("3", TOPOLOGY)], "q")
    assert (v.reason, v.message) == ("NoRackFits", "group 3 not admitted by Kueue (LocalQueue q); group 3: "
                                                   + TOPOLOGY["message"])
    v = kueue_limit([_workload("1", PREEMPTED, QUOTA), _workload("4", TOPOLOGY)], "q")
    # group 1 was preempted; topology outranks preemption; the other kind is named, not quoted
    assert v.reason == "NoRackFits" and v.message == (
        "groups 1, 4 not admitted by Kueue (LocalQueue q); group 4: " + TOPOLOGY["message"]
        + "; Preempted: group 1; status.groups has each group's state and Kueue's message")
    block = Domain("clique-b", 18, ("tray-07",))
    v = kueue_limit([_workload("3", TOPOLOGY)], "q", block, 2)
    assert v.message.endswith("; the largest free block is 1 of 18 trays (rack clique-b) and a group needs 2")
    v = kueue_limit([_workload("1", PREEMPTED)], "q")
    assert v.reason == "Preempted"
    v = kueue_limit([_workload("5")], "q")
    assert (v.reason, v.message) == ("KueuePending", "group 5 not admitted by Kueue (LocalQueue q); group 5: "
                                                     "waiting for Kueue to reserve quota")


def test_autoscaler_counts_a_group_kueue_refused_as_unplaceable_not_coming():
    """F10 under Kueue: a group whose Workload waits on quota or a rack is not capacity on its
    way; one Kueue has not looked at yet (no QuotaReserved condition) is still loading."""
    from kimik3.controller.autoscaling import fleet_state
    def pod(group: str, ready: bool) -> dict:
        return {"metadata": {"name": f"k3-engine-{group}", "creationTimestamp": "2026-12-01T00:00:00Z",
                             "labels": {"leaderworkerset.sigs.k8s.io/group-index": group,
                                        "leaderworkerset.sigs.k8s.io/worker-index": "0",
                                        "leaderworkerset.sigs.k8s.io/name": "k3-engine"}},
                "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}
    pods = [pod("0", True), pod("1", False), pod("2", False)]
    sets = engine_sets([{"metadata": {"name": "k3-engine", "uid": "lws-uid"}, "spec": {"replicas": 3},
                         "status": {"readyReplicas": 1}}], groups_of(pods, 1))
    now = 1_796_083_200.0 + 60  # a minute after creation, well inside the load timeout
    assert fleet_state(sets, 3, groups_of(pods, 1), 5400, now).loading == 2
    refused = fleet_state(sets, 3, groups_of(pods, 1), 5400, now, [_workload("0", ADMITTED), _workload("1", QUOTA), _workload("2")])
    assert (refused.ready, refused.loading, refused.unplaceable) == (1, 1, 1)


def test_a_group_gated_by_kueue_is_said_to_wait_for_admission():
    """Not "SchedulingGated" plus the leader-address budget: the group waits for Kueue."""
    from kimik3.controller.waits import waiting_for
    gated = {"type": "PodScheduled", "status": "False", "reason": "SchedulingGated",
             "message": "Scheduling is blocked due to non-empty scheduling gates"}
    pods = [pod("k3-latency-engine-0", "0", "0"), pod("k3-latency-engine-0-1", "0", "1"),
            pod("k3-latency-engine-1", "1", "0", ready=False, scheduled=gated)]
    pods[2]["spec"] = {"schedulingGates": [{"name": "kueue.x-k8s.io/admission"}, {"name": "kueue.x-k8s.io/topology"}]}
    text = waiting_for(pods, admit(cr()["spec"]), 2)
    assert text == ("group 1: leader pod k3-latency-engine-1 is gated until Kueue admits its group "
                    "(ScalingLimited says why)")


def test_an_admitted_group_the_scheduler_cannot_bind_is_not_blamed_on_room():
    """Kueue admitted the group into a rack, but a deployment with placement exclusive repels it
    there (LWS exclusive topology: pod anti-affinity, which Kueue does not see)."""
    spec = cr()["spec"] | {"scheduling": {"placement": {"mode": "kueue", "queueName": "q"}}}
    refused = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
               "message": "0/36 nodes are available: 1 node(s) didn't satisfy existing pods anti-affinity rules"}
    pods = [pod("k3-latency-engine-0", "0", "0", ready=False, scheduled=refused)]
    status = status_of(cr(), admit(spec), one_set(1, 0, pods), pods, 1, workloads=[_workload("0", ADMITTED)])
    limited = status.condition(ConditionType.SCALING_LIMITED)
    assert (limited.status, limited.reason) == ("True", "Unschedulable")
    assert limited.message.startswith("group 0 cannot be bound in the rack Kueue admitted them into")
    assert "anti-affinity rules" in limited.message and "use placement kueue for every deployment" in limited.message


CLIQUE = "nvidia.com/gpu.clique"
RACKS = {"a-0": "A", "a-1": "A", "a-2": "A", "a-3": "A", "b-0": "B"}
"""Trays of two NVLink domains (the TP8 recipe's topology key: nvidia.com/gpu.clique)."""


def bound(name: str, group: str, worker: str, node: str, affinity: bool = False) -> dict:
    """A Ready pod on ``node``; ``affinity``: with the pod affinity LeaderWorkerSet's pod webhook
    adds for the exclusive topology."""
    out = pod(name, group, worker)
    out["spec"] = {"nodeName": node}
    if affinity:
        out["spec"]["affinity"] = {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": {f"{LWS}/group-key": "k"}}, "topologyKey": CLIQUE}]}}
    return out


def split_fleet(affinity: bool = False) -> list[dict]:
    """Group 0 with its leader in rack A and its worker in rack B; group 1 whole in rack A."""
    return [bound("k3-latency-engine-0", "0", "0", "a-0", affinity), bound("k3-latency-engine-0-1", "0", "1", "b-0"),
            bound("k3-latency-engine-1", "1", "0", "a-1"), bound("k3-latency-engine-1-1", "1", "1", "a-2")]


def test_a_group_split_across_racks_is_never_ready_or_placed() -> None:
    """The LeaderWorkerSet counts both groups Ready; group 0 sits in two NVLink domains, so the
    status counts one, says which group, which racks and what to do."""
    obj = cr()
    admitted = admit(obj["spec"])
    pods = split_fleet()
    status = status_of(obj, admitted, one_set(2, 2, pods), pods, 2, racks=RACKS)
    assert_declared(status)
    ready, limited = status.condition("Ready"), status.condition("ScalingLimited")
    assert ready is not None and limited is not None
    assert (ready.status, ready.reason, status.ready_replicas) == ("False", "GroupsNotReady", 1)
    split = ("group 0 of LeaderWorkerSet k3-latency-engine has pods in racks A and B: it cannot run as one engine "
             "(one NVLink domain per group)")
    assert ready.message == f"1/2 groups ready; {split} (ScalingLimited says what to do)"
    assert (limited.status, limited.reason) == ("True", "GroupSplitAcrossRacks")
    assert limited.message == (
        f"{split} (racks: the trays' {CLIQUE} label); not counted Ready; pod k3-latency-engine-0 has no pod affinity "
        f"on {CLIQUE}: LeaderWorkerSet's pod webhook did not add the exclusive topology, so nothing keeps a group in "
        "one rack. Register the LeaderWorkerSet webhooks (pods included), then delete pod k3-latency-engine-0: the "
        "LeaderWorkerSet recreates the whole group; or use placement kueue")
    groups = status.groups or []
    assert [(g.index, g.rack, g.racks, g.ready) for g in groups] == [(0, None, ["A", "B"], False),
                                                                     (1, "A", ["A"], True)]
    assert groups[0].message == split
    # the pods carry the exclusive affinity: a tray relabelled after binding; the leader is named
    pods = split_fleet(affinity=True)
    limited = status_of(obj, admitted, one_set(2, 2, pods), pods, 2, racks=RACKS).condition("ScalingLimited")
    assert limited is not None and limited.message.endswith(
        f"its pods do carry the exclusive affinity on {CLIQUE}, so a tray's label changed after its pod was bound: "
        "delete pod k3-latency-engine-0, and the LeaderWorkerSet recreates the whole group inside one rack")
    # placement kueue, its pods marked by Kueue's webhook: the operator re-admits it (controller.readmit)
    kueue = cr()
    kueue["spec"]["scheduling"] = {"placement": {"mode": "kueue", "queueName": "default"}}
    admitted = admit(kueue["spec"])
    limited = status_of(kueue, admitted, one_set(2, 2, pods), pods, 2, racks=RACKS, workloads=[]).condition(
        "ScalingLimited")
    assert limited is not None and limited.reason == "GroupSplitAcrossRacks"
    assert limited.message.endswith(
        "pod k3-latency-engine-0 lacks Kueue's kueue.x-k8s.io/pod-suspending-parent mark, so Kueue never admitted the "
        "group and its pods were scheduled without it: register Kueue's webhooks (mleaderworkerset.kb.io and "
        "mpod.kb.io) with the LeaderWorkerSet integration on, then delete pod k3-latency-engine-0: the "
        "LeaderWorkerSet recreates the whole group and Kueue admits it whole")
    for p in pods:
        p["metadata"]["annotations"] = {"kueue.x-k8s.io/pod-suspending-parent": "leaderworkerset.x-k8s.io/v1"}
    limited = status_of(kueue, admitted, one_set(2, 2, pods), pods, 2, racks=RACKS, workloads=[]).condition(
        "ScalingLimited")
    assert limited is not None and limited.message.endswith(
        "the operator deletes each such group's Kueue Workload so that Kueue admits the group again whole, into one "
        "rack with room (Event GroupSplitAcrossRacks)")
    # the same pods in one rack: placed, and Ready
    whole = status_of(obj, admit(obj["spec"]), one_set(2, 2, pods), pods, 2, racks={**RACKS, "b-0": "A"})
    assert (whole.condition("ScalingLimited") or Condition(type="x", status="Unknown", reason="x")).reason == \
        "AllGroupsPlaced"
    assert whole.ready_replicas == 2


def test_all_groups_placed_only_with_every_pod_bound() -> None:
    """No claim of placement without evidence: no LeaderWorkerSet, or pods on no tray (Kueue's gates
    and no Workload: the Kueue manager stopped), is not AllGroupsPlaced."""
    obj = cr()
    obj["spec"]["scheduling"] = {"placement": {"mode": "kueue", "queueName": "default"}}
    admitted = admit(obj["spec"])
    limited = status_of(obj, admitted, [], [], 2).condition("ScalingLimited")
    assert limited is not None and (limited.status, limited.reason, limited.message) == (
        "Unknown", "GroupsNotCreated", "0 of 2 groups exist; the others are not created yet (no LeaderWorkerSet exists)")
    gated = [pod(f"k3-latency-engine-{g}" + (f"-{w}" if w else ""), str(g), str(w), ready=False) for g in (0, 1)
             for w in (0, 1)]
    for p in gated:
        p["spec"] = {"schedulingGates": [{"name": "kueue.x-k8s.io/admission"}]}
    # the LeaderWorkerSet says 2 groups exist: they do, but no pod is on a tray
    limited = status_of(obj, admitted, one_set(2, 0, gated), gated, 2, workloads=[]).condition("ScalingLimited")
    assert limited is not None and (limited.status, limited.reason) == ("Unknown", "GroupsNotPlaced")
    assert limited.message == (
        "group 0: pod k3-latency-engine-0 is bound to no tray (scheduling gates: kueue.x-k8s.io/admission); Kueue made "
        "no Workload for the deployment's groups: is the Kueue manager running with its LeaderWorkerSet integration on?")
    # a group short of pods is not placed either
    short = split_fleet()[:3]
    limited = status_of(cr(), admit(cr()["spec"]), one_set(2, 1, short), short, 2, racks={"b-0": "A"}).condition(
        "ScalingLimited")
    assert limited is not None and (limited.reason, limited.message) == (
        "GroupsNotPlaced", "group 1: 1 of 2 pods exist; the LeaderWorkerSet is (re)creating them")
