"""Where a rollout stands, read off the deployment's LeaderWorkerSets and their pods
(``controller.rollout``), as the status says it: revisions per group, Progressing=True
RolloutInProgress with the figures while two LeaderWorkerSets run (failure case F18), old groups
never counted as updated, an Event per step, SurgeBlocked quoting the scheduler or Kueue. Pure
functions: the LeaderWorkerSets and pods are written as LWS v0.9.0 makes them (name, group-index,
worker-index and template-revision-hash labels; status.replicas and readyReplicas)."""

from __future__ import annotations

from kimik3.admission import admit
from kimik3.api.conditions import ConditionType, Reason
from kimik3.kube.groups import groups_of
from kimik3.controller.fleet import engine_sets
from kimik3.controller.rollout import step_event
from support import snapshots
from support.recipes import recipe

LWS = "leaderworkerset.sigs.k8s.io"
OLD, NEW = "5c7b9d", "6d9f0a"
FIRST, SECOND = "k3-latency-engine", "k3-latency-engine-6d9f0a00"


def cr(generation: int = 4, **spec) -> dict:
    obj = recipe(uid="u1", **spec)
    obj["metadata"]["generation"] = generation
    return obj


def group(index: int, revision: str, ready: bool, lws: str = FIRST, size: int = 2) -> list[dict]:
    """The ``size`` pods of one group (TP8 on GB300: 2 trays)."""
    conditions = [{"type": "Ready", "status": "True"}] if ready else []
    return [{"metadata": {"name": f"{lws}-{index}" + (f"-{w}" if w else ""),
                          "labels": {f"{LWS}/name": lws, f"{LWS}/group-index": str(index),
                                     f"{LWS}/worker-index": str(w), f"{LWS}/template-revision-hash": revision}},
             "status": {"phase": "Running", "conditions": conditions}} for w in range(size)]


def lws(name: str, replicas: int, ready: int, minute: int = 0) -> dict:
    return {"metadata": {"name": name, "uid": f"uid-{name}", "creationTimestamp": f"2026-12-01T00:{minute:02d}:00Z"},
            "spec": {"replicas": replicas}, "status": {"replicas": replicas, "readyReplicas": ready}}


def status_of(obj, lwss, pods, desired, target=None, workloads=None):
    sets = engine_sets(lwss, groups_of(pods, 2))
    chosen = next((s for s in sets if s.name == target), sets[-1] if sets else None)
    return snapshots.status(obj, admit(obj["spec"]), sets, chosen, pods, desired, workloads=workloads)


def test_one_group_rollout_step_by_step():
    obj = cr()
    # the new LeaderWorkerSet's group loads the new revision; the old group serves
    pods = group(0, OLD, True) + group(0, NEW, False, SECOND)
    s = status_of(obj, [lws(FIRST, 1, 1), lws(SECOND, 1, 0, 5)], pods, 1)
    r = s.rollout
    assert (r.current_revision, r.update_revision, r.updated_replicas, r.updated_ready_replicas) == (OLD, NEW, 1, 0)
    assert [(v.revision, v.groups, v.ready_groups) for v in r.revisions] == [(NEW, 1, 0), (OLD, 1, 1)]
    p = s.condition(ConditionType.PROGRESSING)
    assert (p.status, p.reason, p.observed_generation) == ("True", Reason.ROLLOUT_IN_PROGRESS, 4)
    assert p.message == (f"rolling out: revision {NEW}: 1/1 groups updated (0 Ready); revision {OLD}: 1 group "
                         "(1 Ready); maxSurge 1, maxUnavailable 0")
    assert s.condition(ConditionType.READY).status == "True"  # the old group still serves
    assert [(g.leader_worker_set, g.index, g.ready) for g in s.groups] == [(FIRST, 0, True), (SECOND, 0, False)]
    assert step_event(s, admit(obj["spec"]), 1) == ("RolloutStep", p.message.removeprefix("rolling out: "))
    # before its pods exist the update revision is unknown
    s = status_of(obj, [lws(FIRST, 1, 1), lws(SECOND, 1, 0, 5)], group(0, OLD, True), 1)
    assert (s.rollout.current_revision, s.rollout.update_revision, s.rollout.updated_replicas) == (OLD, None, 0)
    assert "revision (not yet created): 0/1 groups updated" in s.condition(ConditionType.PROGRESSING).message
    # done: the old LeaderWorkerSet is gone, its pods terminating
    old_pods = group(0, OLD, True)
    for p in old_pods:
        p["metadata"]["deletionTimestamp"] = "2026-12-01T00:09:00Z"
    s = status_of(obj, [lws(SECOND, 1, 1, 5)], old_pods + group(0, NEW, True, SECOND), 1)
    p = s.condition(ConditionType.PROGRESSING)
    assert (p.status, p.reason) == ("False", Reason.STABLE)
    assert (s.rollout.current_revision, s.rollout.update_revision) == (NEW, NEW)
    assert step_event(s, admit(obj["spec"]), 1) is None


def test_old_groups_never_count_as_the_new_revision_ready():
    # F18: three old groups Ready, the new revision's group still loading
    pods = group(0, OLD, True) + group(1, OLD, True) + group(2, OLD, True) + group(0, NEW, False, SECOND)
    s = status_of(cr(replicas=3), [lws(FIRST, 3, 3), lws(SECOND, 1, 0, 5)], pods, 3)
    assert (s.rollout.updated_replicas, s.rollout.updated_ready_replicas) == (1, 0)
    assert s.ready_replicas == 3 and s.condition(ConditionType.READY).status == "True"
    assert s.condition(ConditionType.PROGRESSING).status == "True"


def test_a_new_deployment_is_starting_not_rolling():
    s = status_of(cr(replicas=2), [lws(FIRST, 2, 0)], group(0, OLD, False) + group(1, OLD, False), 2)
    assert s.condition(ConditionType.PROGRESSING).reason == Reason.GROUPS_STARTING


def test_at_rest_one_revision_and_stable():
    s = status_of(cr(replicas=2), [lws(FIRST, 2, 2)], group(0, OLD, True) + group(1, OLD, True), 2)
    assert s.rollout.model_dump(by_alias=True) == {
        "currentRevision": OLD, "updateRevision": OLD, "updatedReplicas": 2, "updatedReadyReplicas": 2,
        "revisions": [{"revision": OLD, "groups": 2, "readyGroups": 2}], "canary": None, "rolledBack": None,
            "progress": None}
    assert s.condition(ConditionType.PROGRESSING).reason == Reason.STABLE
    assert step_event(s, admit(cr()["spec"]), 2) is None


def unschedulable(pods: list[dict]) -> list[dict]:
    for p in pods:
        p["status"] = {"phase": "Pending", "conditions": [{
            "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
            "message": "0/8 nodes are available: 8 node(s) didn't match pod topology rules."}]}
    return pods


def test_a_surge_group_without_room_blocks_and_says_so():
    sets = [lws(FIRST, 1, 1), lws(SECOND, 1, 0, 5)]
    s = status_of(cr(), sets, group(0, OLD, True) + unschedulable(group(0, NEW, False, SECOND)), 1)
    p = s.condition(ConditionType.PROGRESSING)
    assert (p.status, p.reason) == ("True", Reason.SURGE_BLOCKED)
    assert p.message.startswith(f"group 0 of {SECOND} cannot be placed (no rack has room for it): pod {SECOND}-0: "
                                "0/8 nodes are available")
    assert "no old group is taken down (maxUnavailable 0)" in p.message
    assert s.condition(ConditionType.READY).status == "True"  # the old group still serves
    # Kueue: the new set's Workload is not admitted (an old set's waiting Workload is no surge)
    def workload(uid: str) -> dict:
        return {"metadata": {"labels": {"kueue.x-k8s.io/job-uid": uid},
                             "annotations": {"kueue.x-k8s.io/component-workload-index": "0"}},
                "status": {"conditions": [{"type": "QuotaReserved", "status": "False", "reason": "Pending",
                                           "message": "couldn't assign flavors to pod set main: insufficient "
                                                      "quota for nvidia.com/gpu"}]}}
    pods = group(0, OLD, True) + group(0, NEW, False, SECOND)
    s = status_of(cr(), sets, pods, 1, workloads=[workload(f"uid-{SECOND}")])
    p = s.condition(ConditionType.PROGRESSING)
    assert p.reason == Reason.SURGE_BLOCKED and f"group 0 of {SECOND} is not admitted by Kueue (quota)" in p.message
    s = status_of(cr(), sets, pods, 1, workloads=[workload(f"uid-{FIRST}")])
    assert s.condition(ConditionType.PROGRESSING).reason == Reason.ROLLOUT_IN_PROGRESS
    # with maxUnavailable 1 an old group may go anyway: no SurgeBlocked
    s = status_of(cr(rollout={"maxUnavailable": 1}), sets,
                  group(0, OLD, True) + unschedulable(group(0, NEW, False, SECOND)), 1)
    assert s.condition(ConditionType.PROGRESSING).reason == Reason.ROLLOUT_IN_PROGRESS
