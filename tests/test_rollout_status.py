"""Where a rollout stands, read off the LeaderWorkerSet and its pods (``controller.rollout``), as
the status says it: revisions per group, Progressing=True RolloutInProgress with the figures until
every group runs the new revision (failure case F18), old groups never counted as updated, an
Event per step. Pure functions: the LeaderWorkerSet and pods are written as LWS v0.9.0 makes them
(group-index, worker-index and template-revision-hash labels; status.updatedReplicas,
observedGeneration and the UpdateInProgress condition)."""

from __future__ import annotations

from kimik3.admission import admit
from kimik3.api.conditions import ConditionType, Reason
from kimik3.controller.rollout import step_event
from kimik3.controller.status import compute_status
from support.recipes import recipe

LWS = "leaderworkerset.sigs.k8s.io"
OLD, NEW = "5c7b9d", "6d9f0a"


def cr(generation: int = 4, **spec) -> dict:
    obj = recipe(uid="u1", **spec)
    obj["metadata"]["generation"] = generation
    return obj


def group(index: int, revision: str, ready: bool, size: int = 2) -> list[dict]:
    """The ``size`` pods of one group (TP8 on GB300: 2 trays)."""
    conditions = [{"type": "Ready", "status": "True"}] if ready else []
    return [{"metadata": {"name": f"k3-latency-engine-{index}" + (f"-{w}" if w else ""),
                          "labels": {f"{LWS}/group-index": str(index), f"{LWS}/worker-index": str(w),
                                     f"{LWS}/template-revision-hash": revision}},
             "status": {"phase": "Running", "conditions": conditions}} for w in range(size)]


def lws(replicas: int, groups: int, ready: int, updated: int, generation: int = 7, observed: int = 7,
        updating: bool = False) -> dict:
    conditions = [{"type": "UpdateInProgress", "status": "True"}, {"type": "Progressing", "status": "True"}] \
        if updating else [{"type": "Available", "status": "True"}]
    return {"metadata": {"name": "k3-latency-engine", "generation": generation},
            "spec": {"replicas": replicas},
            "status": {"replicas": groups, "readyReplicas": ready, "updatedReplicas": updated,
                       "observedGeneration": observed, "conditions": conditions}}


def status_of(obj, lws_obj, pods, desired):
    return compute_status(obj, admit(obj["spec"]), lws_obj, pods, desired)


def test_one_group_surge_rollout_step_by_step():
    obj = cr()
    # the edit: the LWS controller has not yet taken the new template
    s = status_of(obj, lws(1, 1, 1, 1, generation=8, observed=7), group(0, OLD, True), 1)
    p = s.condition(ConditionType.PROGRESSING)
    assert (p.status, p.reason) == ("True", Reason.ROLLOUT_IN_PROGRESS)
    assert "has not yet taken generation 8" in p.message and p.observed_generation == 4
    assert s.rollout.update_revision is None and s.rollout.current_revision == OLD
    # the surge group 1 loads the new revision; group 0 serves
    pods = group(0, OLD, True) + group(1, NEW, False)
    s = status_of(obj, lws(1, 2, 1, 1, updating=True), pods, 1)
    r = s.rollout
    assert (r.current_revision, r.update_revision, r.updated_replicas, r.updated_ready_replicas) == (OLD, NEW, 1, 0)
    assert [(v.revision, v.groups, v.ready_groups) for v in r.revisions] == [(NEW, 1, 0), (OLD, 1, 1)]
    p = s.condition(ConditionType.PROGRESSING)
    assert (p.status, p.reason) == ("True", Reason.ROLLOUT_IN_PROGRESS)
    assert p.message == (f"rolling out: revision {NEW}: 1/1 groups updated (0 Ready); revision {OLD}: 1 group "
                         "(1 Ready); maxSurge 1, maxUnavailable 0")
    assert s.condition(ConditionType.READY).status == "True"  # group 0 still serves
    assert step_event(None, s, admit(obj["spec"]), 1) == ("RolloutStep", p.message.removeprefix("rolling out: "))
    # the surge group is Ready, group 0 is recreated on the new revision
    pods = group(0, NEW, False) + group(1, NEW, True)
    s = status_of(obj, lws(1, 2, 1, 2, updating=True), pods, 1)
    assert (s.rollout.updated_replicas, s.rollout.updated_ready_replicas) == (2, 1)
    assert s.condition(ConditionType.PROGRESSING).reason == Reason.ROLLOUT_IN_PROGRESS
    # done: the surge group is gone
    s = status_of(obj, lws(1, 1, 1, 1), group(0, NEW, True), 1)
    p = s.condition(ConditionType.PROGRESSING)
    assert (p.status, p.reason) == ("False", Reason.STABLE)
    assert (s.rollout.current_revision, s.rollout.update_revision) == (NEW, NEW)
    assert step_event(Reason.ROLLOUT_IN_PROGRESS, s, admit(obj["spec"]), 1) == (
        "RolloutComplete", f"every group runs revision {NEW}: 1/1 Ready")
    assert step_event(Reason.STABLE, s, admit(obj["spec"]), 1) is None


def test_old_groups_never_count_as_the_new_revision_ready():
    # F18: three old groups Ready, the new revision's surge group still loading
    pods = group(0, OLD, True) + group(1, OLD, True) + group(2, OLD, True) + group(3, NEW, False)
    s = status_of(cr(replicas=3), lws(3, 4, 3, 1, updating=True), pods, 3)
    assert (s.rollout.updated_replicas, s.rollout.updated_ready_replicas) == (1, 0)
    assert s.ready_replicas == 3 and s.condition(ConditionType.READY).status == "True"
    assert s.condition(ConditionType.PROGRESSING).status == "True"


def test_update_revision_unknown_until_lws_creates_a_group_of_it():
    s = status_of(cr(replicas=2), lws(2, 2, 2, 0, updating=True), group(0, OLD, True) + group(1, OLD, True), 2)
    assert (s.rollout.current_revision, s.rollout.update_revision, s.rollout.updated_replicas) == (OLD, None, 0)
    assert "revision (not yet created): 0/2 groups updated" in s.condition(ConditionType.PROGRESSING).message


def test_a_new_leaderworkerset_is_starting_not_rolling():
    # LWS says UpdateInProgress while the first groups' pods appear (generation 1: never edited)
    s = status_of(cr(replicas=2), lws(2, 2, 0, 1, generation=1, observed=1, updating=True),
                  group(0, OLD, False) + group(1, OLD, False), 2)
    assert s.condition(ConditionType.PROGRESSING).reason == Reason.GROUPS_STARTING


def test_at_rest_one_revision_and_stable():
    s = status_of(cr(replicas=2), lws(2, 2, 2, 2), group(0, OLD, True) + group(1, OLD, True), 2)
    assert s.rollout.model_dump(by_alias=True) == {
        "currentRevision": OLD, "updateRevision": OLD, "updatedReplicas": 2, "updatedReadyReplicas": 2,
        "revisions": [{"revision": OLD, "groups": 2, "readyGroups": 2}], "canary": None, "rolledBack": None}
    assert s.condition(ConditionType.PROGRESSING).reason == Reason.STABLE
    assert step_event(None, s, admit(cr()["spec"]), 2) is None


def unschedulable(pods: list[dict]) -> list[dict]:
    for p in pods:
        p["status"] = {"phase": "Pending", "conditions": [{
            "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
            "message": "0/8 nodes are available: 8 node(s) didn't match pod topology rules."}]}
    return pods


def test_a_surge_group_without_room_blocks_and_says_so():
    pods = group(0, OLD, True) + unschedulable(group(1, NEW, False))
    s = status_of(cr(), lws(1, 2, 1, 1, updating=True), pods, 1)
    p = s.condition(ConditionType.PROGRESSING)
    assert (p.status, p.reason) == ("True", Reason.SURGE_BLOCKED)
    assert p.message.startswith("surge group 1 cannot be placed (no rack has room for it): pod k3-latency-engine-1: "
                                "0/8 nodes are available")
    assert "no old group is taken down (maxUnavailable 0)" in p.message
    assert s.condition(ConditionType.READY).status == "True"  # group 0 still serves
    # Kueue: the surge group's Workload is not admitted
    workload = {"metadata": {"annotations": {"kueue.x-k8s.io/component-workload-index": "1"}},
                "status": {"conditions": [{"type": "QuotaReserved", "status": "False", "reason": "Pending",
                                           "message": "couldn't assign flavors to pod set main: insufficient "
                                                      "quota for nvidia.com/gpu"}]}}
    s = compute_status(cr(), admit(cr()["spec"]), lws(1, 2, 1, 1, updating=True),
                       group(0, OLD, True) + group(1, NEW, False), 1, workloads=[workload])
    p = s.condition(ConditionType.PROGRESSING)
    assert p.reason == Reason.SURGE_BLOCKED and "surge group 1 is not admitted by Kueue (quota)" in p.message
    # with maxUnavailable 1 an old group may go anyway: no SurgeBlocked
    s = status_of(cr(rollout={"maxUnavailable": 1}), lws(1, 2, 1, 1, updating=True),
                  group(0, OLD, True) + unschedulable(group(1, NEW, False)), 1)
    assert s.condition(ConditionType.PROGRESSING).reason == Reason.ROLLOUT_IN_PROGRESS
