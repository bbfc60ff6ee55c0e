"""A LeaderWorkerSet per revision (``controller.fleet``): how many groups each set gets as the
new one's groups turn Ready, which sets are created, held and deleted, under Surge, Recreate, a
canary, a pause and a rollback. Pure: the LeaderWorkerSets are written as the API server returns
them (name, uid, creationTimestamp, the template-hash and replicas annotations)."""

from __future__ import annotations

import pytest

from kimik3.kube.groups import groups_of
from kimik3.controller.fleet import REPLICAS_ANNOTATION, engine_sets, fleet_replicas, plan, sizes
from kimik3.render.revision import TEMPLATE_HASH_ANNOTATION

LWS = "leaderworkerset.sigs.k8s.io"
OLD, NEW = "aaaaaaaaaaaa", "bbbbbbbbbbbb"


@pytest.mark.parametrize("replicas,surge,unavailable,target_ready,old,expected", [
    (1, 1, 0, 0, [(1, 1)], (1, [1])),            # one group: the new one loads beside the old
    (1, 1, 0, 1, [(1, 1)], (1, [0])),            # ... and the old goes once it is Ready: one load
    (3, 1, 0, 0, [(3, 3)], (1, [3])),
    (3, 1, 0, 1, [(3, 3)], (2, [2])),            # one old group goes per new Ready group
    (3, 1, 0, 3, [(1, 1)], (3, [0])),
    (3, 2, 0, 0, [(3, 3)], (2, [3])),            # maxSurge 2: two at a time
    (3, 1, 1, 0, [(3, 3)], (2, [2])),            # maxUnavailable 1: one old group goes at once
    (1, 1, 5, 0, [(1, 1)], (1, [1])),            # Surge never takes the last serving group
    (1, 0, 1, 0, [(1, 1)], (1, [0])),            # maxSurge 0: the one group is replaced in place
    (3, 0, 3, 0, [(3, 3)], (3, [0])),            # Recreate: every group at once
    (5, 1, 0, 1, [(2, 2)], (4, [2])),            # scaled up mid-rollout: the new set grows
    (1, 1, 0, 1, [(2, 2)], (1, [0])),            # scaled down mid-rollout
    (3, 1, 0, 0, [(3, 3), (1, 0)], (1, [3, 0])),  # F17: a loading group of B goes before a serving one of A
    (3, 1, 0, 1, [(1, 1), (2, 2)], (2, [1, 1])),
])
def test_sizes(replicas, surge, unavailable, target_ready, old, expected):
    assert sizes(replicas, surge, unavailable, target_ready, old) == expected


def test_a_canary_holds_the_new_set_beside_every_old_group():
    assert sizes(3, 1, 0, 1, [(3, 3)], canary=1) == (1, [3])
    assert sizes(3, 2, 0, 0, [(3, 3)], canary=2) == (2, [3])
    # a canary set on mid-rollout never shrinks the new set below the groups it has
    assert sizes(3, 1, 0, 2, [(1, 1)], canary=1, target_now=2) == (2, [1])


def test_with_no_room_an_old_group_that_is_not_ready_gives_its_place():
    """Issue 25 item 4: on a full cluster the surge group cannot be placed (SurgeBlocked). Old
    groups that serve stay (maxUnavailable 0); those not Ready give their place to new groups."""
    assert sizes(1, 1, 0, 0, [(1, 0)]) == (1, [1])  # room or not: without make_room the old group waits
    assert sizes(1, 1, 0, 0, [(1, 0)], make_room=True) == (1, [0])
    assert sizes(3, 1, 0, 0, [(3, 1)], make_room=True) == (3, [1])  # the serving one stays; two new take the others'
    assert sizes(3, 1, 0, 0, [(3, 3)], make_room=True) == (1, [3])  # every old group serves: nothing goes
    assert sizes(3, 1, 0, 1, [(2, 0)], canary=1, target_now=1, make_room=True) == (1, [0])


def lws(name: str, template: str, replicas: int, minute: int = 0, deleting: bool = False) -> dict:
    meta = {"name": name, "uid": f"uid-{name}", "creationTimestamp": f"2026-12-01T00:{minute:02d}:00Z",
            "annotations": {TEMPLATE_HASH_ANNOTATION: template}}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-01T01:00:00Z"
    return {"metadata": meta, "spec": {"replicas": replicas, "leaderWorkerTemplate": {"size": 1, "t": template}}}


def rendered(replicas: int, template: str = NEW) -> dict:
    return {"metadata": {"name": "k3-engine", "labels": {}, "annotations": {TEMPLATE_HASH_ANNOTATION: template}},
            "spec": {"replicas": replicas, "leaderWorkerTemplate": {"size": 1, "t": template}}}


def leader(lws_name: str, index: int, ready: bool) -> dict:
    return {"metadata": {"name": f"{lws_name}-{index}", "labels": {
        f"{LWS}/name": lws_name, f"{LWS}/group-index": str(index), f"{LWS}/worker-index": "0"}},
        "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def summary(p) -> tuple:
    return ([(b["metadata"]["name"], b["spec"]["replicas"], b["spec"]["leaderWorkerTemplate"]["t"]) for b in p.apply],
            p.delete, p.target)


def test_the_first_set_is_named_after_the_deployment():
    assert summary(plan(rendered(2), [], 2, 1, 0)) == ([("k3-engine", 2, NEW)], [], "k3-engine")


def test_a_template_change_rolls_through_a_new_set_and_the_old_one_goes():
    old = lws("k3-engine", OLD, 1)
    start = plan(rendered(1), engine_sets([old], groups_of([leader("k3-engine", 0, True)], 1)), 1, 1, 0)
    assert summary(start) == ([("k3-engine", 1, OLD), ("k3-engine-bbbbbbbb", 1, NEW)], [], "k3-engine-bbbbbbbb")
    assert start.apply[0]["metadata"]["annotations"] == {TEMPLATE_HASH_ANNOTATION: OLD, REPLICAS_ANNOTATION: "1"}
    new = lws("k3-engine-bbbbbbbb", NEW, 1, minute=5)
    pods = [leader("k3-engine", 0, True), leader("k3-engine-bbbbbbbb", 0, True)]
    done = plan(rendered(1), engine_sets([new, old], groups_of(pods, 1)), 1, 1, 0)  # listed in any order
    assert summary(done) == ([("k3-engine-bbbbbbbb", 1, NEW)], ["k3-engine"], "k3-engine-bbbbbbbb")
    assert done.complete and not start.complete
    # the next change takes the first name again, once it is free
    gone = plan(rendered(1, "cccccccccccc"), engine_sets([new], groups_of([leader("k3-engine-bbbbbbbb", 0, True)], 1)), 1, 1, 0)
    assert gone.target == "k3-engine"
    taken = plan(rendered(1, "cccccccccccc"), engine_sets([new, lws("k3-engine", OLD, 0, deleting=True)], groups_of([], 1)),
                 1, 1, 0)
    assert (taken.target, [b["metadata"]["name"] for b in taken.apply]) == ("k3-engine-cccccccc",
                                                                           ["k3-engine-bbbbbbbb", "k3-engine-cccccccc"])


def test_a_revert_during_a_rollout_makes_the_old_set_the_target():
    sets = engine_sets([lws("k3-engine", OLD, 3), lws("k3-engine-bbbbbbbb", NEW, 1, minute=5)], groups_of([leader("k3-engine", i, True) for i in range(3)] + [leader("k3-engine-bbbbbbbb", 0, False)], 1))
    assert summary(plan(rendered(3, OLD), sets, 3, 1, 0)) == ([("k3-engine", 3, OLD)], ["k3-engine-bbbbbbbb"],
                                                              "k3-engine")


def test_a_pause_creates_no_set_and_a_replica_change_still_applies():
    sets = engine_sets([lws("k3-engine", OLD, 1)], groups_of([leader("k3-engine", 0, True)], 1))
    assert summary(plan(rendered(2), sets, 2, 1, 0, paused=True)) == ([("k3-engine", 2, OLD)], [], "k3-engine")
    both = engine_sets([lws("k3-engine", OLD, 1), lws("k3-engine-bbbbbbbb", NEW, 1, minute=5)], groups_of([], 1))
    frozen = plan(rendered(1), both, 1, 1, 0, paused=True)
    assert summary(frozen) == ([("k3-engine", 1, OLD), ("k3-engine-bbbbbbbb", 1, NEW)], [], "k3-engine-bbbbbbbb")


def test_a_rolled_back_template_is_deleted_and_never_created_again():
    sets = engine_sets([lws("k3-engine", OLD, 1), lws("k3-engine-bbbbbbbb", NEW, 1, minute=5)], groups_of([leader("k3-engine", 0, True), leader("k3-engine-bbbbbbbb", 0, True)], 1))
    back = plan(rendered(1), sets, 1, 1, 0, refused=NEW)
    assert summary(back) == ([("k3-engine", 1, OLD)], ["k3-engine-bbbbbbbb"], "k3-engine")
    assert not back.complete  # a rollback, not a rollout done
    alone = engine_sets([lws("k3-engine", OLD, 1)], groups_of([leader("k3-engine", 0, True)], 1))
    assert summary(plan(rendered(2), alone, 2, 1, 0, refused=NEW)) == ([("k3-engine", 2, OLD)], [], "k3-engine")


def test_a_release_rolled_back_mid_rollout_drains_as_the_restored_groups_turn_ready():
    """Issue 25 item 3: a progress deadline can roll back a release that already serves groups
    (no canary). Its Ready groups serve on while the old set grows back: never fewer than
    replicas - maxUnavailable Ready groups, and the release's set goes once drained."""
    new_set = "k3-engine-bbbbbbbb"
    sets = engine_sets([lws("k3-engine", OLD, 2), lws(new_set, NEW, 2, minute=5)], groups_of(
        [leader("k3-engine", 0, True), leader("k3-engine", 1, True), leader(new_set, 0, True),
         leader(new_set, 1, False)], 1))
    back = plan(rendered(3), sets, 3, 1, 0, refused=NEW)
    assert summary(back) == ([(new_set, 1, NEW), ("k3-engine", 3, OLD)], [], "k3-engine")
    restored = engine_sets([lws("k3-engine", OLD, 3), lws(new_set, NEW, 1, minute=5)], groups_of(
        [leader("k3-engine", i, True) for i in range(3)] + [leader(new_set, 0, True)], 1))
    done = plan(rendered(3), restored, 3, 1, 0, refused=NEW)
    assert summary(done) == ([("k3-engine", 3, OLD)], [new_set], "k3-engine") and not done.complete


def test_the_fleets_replicas_are_the_newest_sets_annotation():
    old, new = lws("k3-engine", OLD, 2), lws("k3-engine-bbbbbbbb", NEW, 1, minute=5)
    new["metadata"]["annotations"][REPLICAS_ANNOTATION] = "2"
    assert fleet_replicas(engine_sets([old, new], groups_of([], 1))) == 2
    assert fleet_replicas(engine_sets([old], groups_of([], 1))) == 2 and fleet_replicas([]) is None
