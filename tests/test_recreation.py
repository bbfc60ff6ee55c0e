"""Bounded recreation (kimik3.controller.recreation): when failures make a deployment Degraded,
the start back-off they give, when they are forgotten, and that they belong to the revision and
group that earned them (issue 25 item 4: a fix is never held by the release it replaces)."""

from __future__ import annotations

from kimik3.api.conditions import Reason
from kimik3.controller.recreation import BACKOFF_MAX_S, FAILURES, WINDOW_S, GroupFailures

ENGINE, BAD, FIX = "k3-engine", "k3-engine-bad00000", "k3-engine-fix00000"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_three_failures_in_ten_minutes_degrade_with_doubling_back_off_then_age_out():
    clock = Clock()
    failures = GroupFailures(clock)
    assert FAILURES == 3 and WINDOW_S == 600

    def charged(namespace: str = "ns"):
        return failures.charged(namespace, "k3", [ENGINE])

    for i, (group, code, reason) in enumerate([("0", 1, "Error"), ("1", 137, "OOMKilled")]):
        failures.record("ns", "k3", f"uid{i}/engine/t", ENGINE, group, code, reason)
        clock.now += 60
    assert charged().verdict() is None and charged().start_delay_s([ENGINE]) == 0
    failures.record("ns", "k3", "uid1/engine/t", ENGINE, "1", 137, "OOMKilled")  # the same termination again
    assert charged().verdict() is None
    failures.record("ns", "k3", "uid2/engine/t", ENGINE, "0", 1, "Error")
    verdict = charged().verdict()
    assert verdict is not None and verdict.status == "True" and verdict.reason == Reason.GROUP_CRASH_LOOPING
    assert f"group(s) {ENGINE}/0, {ENGINE}/1 failed 3 times in the last 10 min (last" in verdict.message
    assert "last exit codes: 1 (Error), 137 (OOMKilled), 1 (Error)" in verdict.message
    assert charged().start_delay_s([ENGINE]) == 10
    for i in range(3, 10):
        failures.record("ns", "k3", f"uid{i}/engine/t", ENGINE, "0", 1, "Error")
    assert charged().start_delay_s([ENGINE]) == BACKOFF_MAX_S == 300  # 10 * 2**7 capped
    assert charged("other").verdict() is None
    clock.now += WINDOW_S + 1
    assert charged().verdict() is None and charged().start_delay_s([ENGINE]) == 0


def test_a_fix_starts_clean_and_degraded_clears_once_the_groups_are_ready():
    """A crash-looping release (its own LeaderWorkerSet) earned 80 s of back-off; the fix's
    LeaderWorkerSet starts without any. Degraded stays while the release's set is live, even
    when its group looks Ready between crashes, and clears once its set is gone."""
    clock = Clock()
    failures = GroupFailures(clock)
    for i in range(FAILURES + 3):
        failures.record("ns", "k3", f"bad{i}/engine/t", BAD, "0", 1, "Error")
        clock.now += 20
    rolling = failures.charged("ns", "k3", [ENGINE, BAD, FIX])
    assert rolling.start_delay_s([BAD]) == 80 and rolling.start_delay_s([FIX]) == 0
    assert rolling.verdict() is not None and f"{BAD}/0 failed 6 times" in rolling.verdict().message
    # the release's set is gone (rolled away): nothing is charged
    done = failures.charged("ns", "k3", [ENGINE, FIX])
    assert done.verdict() is None and done.failures == ()
    # while its set is live, its failures count, Ready or not (a pod without a probe is Ready until it exits)
    live = failures.charged("ns", "k3", [BAD])
    assert live.verdict() is not None and live.start_delay_s([BAD]) == 80
