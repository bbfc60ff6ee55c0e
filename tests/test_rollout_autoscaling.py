"""The autoscaler during a rollout (issue 12, item 6), on one decision's inputs: surge and canary
groups (index >= spec.replicas, on the new revision) count as loading, never as serving groups
or capacity; spec.autoscaling's bounds hold whatever the policy held. The LeaderWorkerSet and
pods are written as LWS v0.9.0 makes them (its status.readyReplicas counts every Ready leader,
surge groups included); tests/test_autoscaling_controller.py drives the same on a real API server."""

from __future__ import annotations

from kimik3.autoscaler.policy import Decision
from kimik3.controller.autoscaling import fleet_state, within_bounds

LWS = "leaderworkerset.sigs.k8s.io"
CREATED = "2026-12-01T00:00:00Z"
NOW = 1_796_083_200.0 + 60  # a minute after CREATED: inside any load timeout


def leader(index: int, ready: bool, deleting: bool = False) -> dict:
    meta = {"name": f"k3-engine-{index}", "creationTimestamp": CREATED,
            "labels": {f"{LWS}/group-index": str(index), f"{LWS}/worker-index": "0"}}
    if deleting:
        meta["deletionTimestamp"] = CREATED
    return {"metadata": meta, "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def lws(replicas: int, ready: int) -> dict:
    return {"spec": {"replicas": replicas}, "status": {"readyReplicas": ready}}


def test_a_loading_surge_group_counts_as_loading():
    fleet = fleet_state(lws(2, 2), [leader(0, True), leader(1, True), leader(2, False)], 5400, NOW)
    assert (fleet.current, fleet.ready, fleet.loading, fleet.serving) == (2, 2, 1, frozenset({"0", "1"}))


def test_a_ready_surge_or_canary_group_is_loading_not_capacity():
    # LWS says 3 Ready (the surge group 2 among them): 2 serve as capacity, the surge one comes
    fleet = fleet_state(lws(2, 3), [leader(0, True), leader(1, True), leader(2, True)], 5400, NOW)
    assert (fleet.current, fleet.ready, fleet.loading, fleet.serving) == (2, 2, 1, frozenset({"0", "1"}))
    # mid-rollout: group 1 recreated on the new revision (loading), the surge group 2 Ready
    fleet = fleet_state(lws(2, 2), [leader(0, True), leader(1, False), leader(2, True)], 5400, NOW)
    assert (fleet.ready, fleet.loading, fleet.serving) == (1, 2, frozenset({"0"}))


def test_a_group_being_removed_by_a_scale_down_is_not_a_surge_group():
    fleet = fleet_state(lws(1, 2), [leader(0, True), leader(1, True, deleting=True)], 5400, NOW)
    assert (fleet.current, fleet.loading) == (1, 0)


def test_the_bounds_hold_whatever_the_policy_held():
    held = Decision(3, "GroupsLoading", "1 group(s) still loading count as coming", 3)
    assert within_bounds(held, 1, 4) is held
    lowered = within_bounds(held, 1, 2)
    assert (lowered.desired, lowered.reason, lowered.recommendation) == (2, "ReplicaBounds", 3)
    assert lowered.message == ("spec.autoscaling.maxReplicas is 2 (the policy said 3: GroupsLoading: "
                               "1 group(s) still loading count as coming)")
    raised = within_bounds(Decision(1, "Hold", "p90 TPOT 4.00 ms"), 2, 4)
    assert (raised.desired, raised.reason) == (2, "ReplicaBounds") and "minReplicas is 2" in raised.message
