"""Bounded recreation (kimik3.controller.recreation): when failures make a deployment Degraded,
the start back-off they give, and when they are forgotten."""

from __future__ import annotations

from kimik3.api.conditions import Reason
from kimik3.controller.recreation import BACKOFF_MAX_S, FAILURES, WINDOW_S, GroupFailures


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_three_failures_in_ten_minutes_degrade_with_doubling_back_off_then_age_out():
    clock = Clock()
    failures = GroupFailures(clock)
    assert FAILURES == 3 and WINDOW_S == 600
    for i, (group, code, reason) in enumerate([("0", 1, "Error"), ("1", 137, "OOMKilled")]):
        failures.record("ns", "k3", f"uid{i}/engine/t", group, code, reason)
        clock.now += 60
    assert failures.verdict("ns", "k3") is None and failures.start_delay_s("ns", "k3") == 0
    failures.record("ns", "k3", "uid1/engine/t", "1", 137, "OOMKilled")  # the same termination again
    assert failures.verdict("ns", "k3") is None
    failures.record("ns", "k3", "uid2/engine/t", "0", 1, "Error")
    verdict = failures.verdict("ns", "k3")
    assert verdict is not None and verdict.status == "True" and verdict.reason == Reason.GROUP_CRASH_LOOPING
    assert "group(s) 0, 1 failed 3 times in the last 10 min" in verdict.message
    assert "last exit codes: 1 (Error), 137 (OOMKilled), 1 (Error)" in verdict.message
    assert failures.start_delay_s("ns", "k3") == 10
    for i in range(3, 10):
        failures.record("ns", "k3", f"uid{i}/engine/t", "0", 1, "Error")
    assert failures.start_delay_s("ns", "k3") == BACKOFF_MAX_S == 300  # 10 * 2**7 capped
    assert failures.verdict("other", "k3") is None
    clock.now += WINDOW_S + 1
    assert failures.verdict("ns", "k3") is None and failures.start_delay_s("ns", "k3") == 0
