"""The autoscaler during a rollout (issue 12, item 6), on one decision's inputs: the groups of a
rollout's new LeaderWorkerSet beyond the fleet's replicas (its surge, a canary) count as loading,
never as serving groups or capacity; spec.autoscaling's bounds hold whatever the policy held. The
LeaderWorkerSets and pods are written as LWS v0.9.0 makes them (group-index, worker-index and name
labels); tests/test_autoscaling_controller.py drives the same on a real API server."""

from __future__ import annotations

from kimik3.autoscaler.policy import Decision
from kimik3.controller.autoscaling import fleet_state, within_bounds
from kimik3.kube.groups import groups_of
from kimik3.controller.fleet import engine_sets

LWS = "leaderworkerset.sigs.k8s.io"
CREATED = "2026-12-01T00:00:00Z"
NOW = 1_796_083_200.0 + 60  # a minute after CREATED: inside any load timeout


def leader(index: int, ready: bool, lws: str = "k3-engine", deleting: bool = False) -> dict:
    meta = {"name": f"{lws}-{index}", "creationTimestamp": CREATED,
            "labels": {f"{LWS}/group-index": str(index), f"{LWS}/worker-index": "0", f"{LWS}/name": lws}}
    if deleting:
        meta["deletionTimestamp"] = CREATED
    return {"metadata": meta, "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def sets(pods: list[dict], **replicas: int) -> list:
    """One LeaderWorkerSet per keyword (its name with ``_`` for ``-``), oldest first, its
    status.readyReplicas counted from ``pods`` as LWS counts it."""
    def ready(lws: str, n: int) -> int:  # LWS's status.readyReplicas: its Ready groups below replicas
        return sum(1 for p in pods if p["metadata"]["labels"][f"{LWS}/name"] == lws and not
                   p["metadata"].get("deletionTimestamp") and int(p["metadata"]["labels"][f"{LWS}/group-index"]) < n
                   and p["status"]["conditions"][0]["status"] == "True")
    lwss = [{"metadata": {"name": name.replace("_", "-"), "uid": name, "creationTimestamp": f"2026-12-01T00:0{i}:00Z"},
             "spec": {"replicas": n}, "status": {"readyReplicas": ready(name.replace("_", "-"), n)}}
            for i, (name, n) in enumerate(replicas.items())]
    return engine_sets(lwss, groups_of(pods, 1))


def test_a_loading_target_group_counts_as_loading():
    pods = [leader(0, True), leader(1, True), leader(0, False, "k3-engine-b")]
    fleet = fleet_state(sets(pods, k3_engine=2, k3_engine_b=1), 2, groups_of(pods, 1), 5400, NOW)
    assert (fleet.current, fleet.ready, fleet.loading, fleet.serving) == (2, 2, 1, frozenset({"0", "1"}))


def test_a_ready_target_group_beyond_the_replicas_is_loading_not_capacity():
    # 3 Ready groups for 2 replicas (the target's group just turned Ready): 2 count, one comes
    pods = [leader(0, True), leader(1, True), leader(0, True, "k3-engine-b")]
    fleet = fleet_state(sets(pods, k3_engine=2, k3_engine_b=1), 2, groups_of(pods, 1), 5400, NOW)
    assert (fleet.current, fleet.ready, fleet.loading) == (2, 2, 1)
    # the old set gave up a group: one old and one new serve, the target's second group loads
    pods = [leader(0, True), leader(0, True, "k3-engine-b"), leader(1, False, "k3-engine-b")]
    fleet = fleet_state(sets(pods, k3_engine=1, k3_engine_b=2), 2, groups_of(pods, 1), 5400, NOW)
    assert (fleet.ready, fleet.loading, fleet.serving) == (2, 1, frozenset({"0"}))


def test_groups_asked_for_but_in_no_set_yet_count_as_loading():
    # 5 asked for during a canary bake, the sets hold 3 + 1: the fifth is coming, not missing
    pods = [leader(i, True) for i in range(3)] + [leader(0, True, "k3-engine-b")]
    fleet = fleet_state(sets(pods, k3_engine=3, k3_engine_b=1), 5, groups_of(pods, 1), 5400, NOW)
    assert (fleet.current, fleet.ready, fleet.loading) == (5, 4, 1)


def test_a_group_being_removed_by_a_scale_down_is_not_a_surge_group():
    pods = [leader(0, True), leader(1, True, deleting=True)]
    fleet = fleet_state(sets(pods, k3_engine=1), 1, groups_of(pods, 1), 5400, NOW)
    assert (fleet.current, fleet.ready, fleet.loading) == (1, 1, 0)


def test_the_bounds_hold_whatever_the_policy_held():
    held = Decision(3, "GroupsLoading", "1 group(s) still loading count as coming", 3)
    assert within_bounds(held, 1, 4) is held
    lowered = within_bounds(held, 1, 2)
    assert (lowered.desired, lowered.reason, lowered.recommendation) == (2, "ReplicaBounds", 3)
    assert lowered.message == ("spec.autoscaling.maxReplicas is 2 (the policy said 3: GroupsLoading: "
                               "1 group(s) still loading count as coming)")
    raised = within_bounds(Decision(1, "Hold", "p90 TPOT 4.00 ms"), 2, 4)
    assert (raised.desired, raised.reason) == (2, "ReplicaBounds") and "minReplicas is 2" in raised.message
