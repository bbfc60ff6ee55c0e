"""Stabilization and bounds alone (autoscaler/policy/stabilization.py): recommendations bounded by
min/max, the highest of each window, one more group only once a window agrees (what a window
agreed on: ``sustained``), no scale-down
before a whole window of history, and no traffic as a reading (F11). Decisions every 30 s."""

from __future__ import annotations

from kimik3.autoscaler.policy.stabilization import Stabilization


def stab(min_replicas: int = 1, max_replicas: int = 8, up: float = 0, down: float = 300) -> Stabilization:
    return Stabilization(min_replicas, max_replicas, up, down)


def test_recommendations_are_bounded_by_min_and_max():
    s = stab(min_replicas=2, max_replicas=6)
    assert s.record(0, 9, 1, 120) == (6, 2)
    assert s.levels(0) == (6, 2)


def test_each_level_is_the_highest_of_its_window():
    s = stab(up=60, down=300)
    for t, rec in [(0, (5, 5)), (30, (3, 4)), (60, (2, 2)), (90, (2, 2))]:
        s.record(t, *rec, 120)
    assert s.levels(90) == (3, 5)  # up: 30-90 s; down: 0-90 s
    for t in range(120, 330, 30):
        s.record(t, 2, 2, 120)
    assert s.levels(300) == (2, 5) and s.levels(330) == (2, 4)


def test_a_recommendation_older_than_every_window_is_forgotten():
    s = stab(up=0, down=60)
    s.record(0, 7, 7, 30)
    s.record(90, 2, 2, 30)  # 90 s later: past the longest window (60 s)
    assert s.levels(90) == (2, 2)
    assert not s.agreed(90, 2, 120, 30)


def test_one_more_group_waits_until_the_recommendations_of_a_window_agree():
    """A 120 s window read every 30 s: four recommendations in a row (90 s apart first to last)."""
    s = stab()
    for t in (0, 30, 60):
        s.record(t, 3, 3, 120)
        assert not s.agreed(t, 2, 120, 30), t
    s.record(90, 3, 3, 120)
    assert s.agreed(90, 2, 120, 30)
    s.record(120, 2, 2, 120)  # a reading that asks for none more restarts the count
    s.record(150, 3, 3, 120)
    assert not s.agreed(150, 2, 120, 30)


def test_sustained_is_the_most_groups_a_whole_window_of_recommendations_asked_for():
    """A 120 s window read every 30 s: the lowest of the last four recommendations (the newest one
    at or before the window's start on); None while the history is shorter."""
    s = stab()
    for t, rec in [(0, 5), (30, 6), (60, 5)]:
        s.record(t, rec, rec, 120)
        assert s.sustained(t, 120, 30) is None, t
    s.record(90, 6, 6, 120)
    assert s.sustained(90, 120, 30) == 5
    s.record(120, 6, 6, 120)
    assert s.sustained(120, 120, 30) == 5  # 30-120 s: 6, 5, 6, 6
    s.record(150, 7, 7, 120)
    assert s.sustained(150, 120, 30) == 5  # 60-150 s: 5, 6, 6, 7
    s.record(180, 7, 7, 120)
    assert s.sustained(180, 120, 30) == 6 and s.agreed(180, 5, 120, 30) and not s.agreed(180, 6, 120, 30)


def test_no_scale_down_before_a_whole_window_since_the_first_decision():
    s = stab(down=300)
    assert not s.warmed(1000)  # never started
    s.start(1000)
    s.start(1100)  # later decisions do not restart it
    assert not s.warmed(1299) and s.warmed(1300)


def test_no_traffic_is_min_replicas_unless_scale_to_zero_saw_traffic_within_the_window():
    one = stab(min_replicas=1)
    assert one.without_traffic(0, 4) == (1, "NoTraffic")
    zero = stab(min_replicas=0, down=300)
    assert zero.without_traffic(0, 3) == (0, "NoTraffic")  # none ever seen
    zero.traffic(100)
    assert zero.without_traffic(399, 3) == (3, "RecentTraffic")
    assert zero.without_traffic(399, 0) == (1, "RecentTraffic")  # at least one group
    assert zero.without_traffic(400, 3) == (0, "NoTraffic")
