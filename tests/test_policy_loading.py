"""Groups coming (autoscaler/policy/loading.py): the policy's scale-ups until their groups serve,
the load time they take (the policy's own, else the cluster's), and when the serving count
last moved."""

from __future__ import annotations

from kimik3.autoscaler.policy.interface import FleetState
from kimik3.autoscaler.policy.loading import GroupArrivals, ScaleUp


def test_a_scale_up_arrives_when_its_groups_serve_and_times_the_load():
    a = GroupArrivals()
    a.observe(0, FleetState(current=2, ready=2))
    up = ScaleUp(at=0, target=5, demand=40_000)
    a.asked(up)
    assert a.observe(600, FleetState(current=5, ready=4, loading=1)) == []  # one still loading
    assert a.load_time_s is None
    assert a.observe(930, FleetState(current=5, ready=5)) == [up]
    assert a.load_time_s == 930
    assert a.observe(960, FleetState(current=5, ready=5)) == []  # reported once


def test_the_clusters_load_time_serves_until_the_policy_has_timed_its_own():
    a = GroupArrivals()
    a.observe(0, FleetState(current=2, ready=2, load_time_s=900))
    assert a.load_time_s == 900
    a.observe(30, FleetState(current=2, ready=2))  # no figure this time: the last one stands
    assert a.load_time_s == 900
    a.asked(ScaleUp(at=30, target=3, demand=0))
    a.observe(1230, FleetState(current=3, ready=3, load_time_s=870))
    assert a.load_time_s == 1200  # its own, not the cluster's 870


def test_a_scale_up_undone_or_unplaceable_is_forgotten():
    a = GroupArrivals()
    a.asked(ScaleUp(at=0, target=4, demand=0))
    a.asked(ScaleUp(at=0, target=6, demand=0))
    a.observe(30, FleetState(current=4, ready=2, loading=2))  # someone set 4: the 6 is undone
    assert a.observe(900, FleetState(current=6, ready=6)) == [ScaleUp(at=0, target=4, demand=0)]
    b = GroupArrivals()
    b.asked(ScaleUp(at=0, target=5, demand=0))
    b.observe(30, FleetState(current=5, ready=2, loading=2, unplaceable=1))  # one cannot be placed
    assert b.observe(900, FleetState(current=5, ready=5)) == [] and b.load_time_s is None


def test_the_serving_count_settles_and_groups_that_joined_are_remembered():
    a = GroupArrivals()
    assert a.settled(0, 120) and not a.joined(0, 120)  # nothing seen yet
    a.observe(0, FleetState(current=2, ready=2))  # the first look is a change, not a join
    assert (a.ready_changed, a.ready_rose) == (0, None)
    assert not a.settled(90, 120) and a.settled(120, 120)
    a.observe(300, FleetState(current=2, ready=1))  # one lost: changed, not joined
    assert (a.ready_changed, a.ready_rose) == (300, None)
    a.observe(600, FleetState(current=2, ready=2))
    assert a.joined(700, 120) and not a.joined(720, 120) and not a.settled(700, 120)
