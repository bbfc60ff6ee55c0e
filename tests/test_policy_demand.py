"""The demand now from one observation (autoscaler/policy/demand.py): the queue's share, Little's
law for the concurrency per group, per-token against per-step units, and the panic path on a
saturated fleet. Target 5 ms per token; the test model's mean latency is 2.5 ms + 0.05 ms x c."""

from __future__ import annotations

import pytest

from kimik3.autoscaler.histogram import INF, Histogram
from kimik3.autoscaler.observation import DecodeObservation
from kimik3.autoscaler.policy.demand import SATURATED, panic, read
from kimik3.autoscaler.policy.model import GroupLatencyModel
from tests.test_autoscaler_policy import TARGET, obs

MODEL = GroupLatencyModel(t0=0.0025, k=0.00005)


def test_the_window_throughput_is_scaled_up_by_the_queue():
    o = obs(0, tok_s=8_000, running=30, waiting=10, latency=0.004)
    r = read(o, 0.004, MODEL, 2, TARGET, per_step=False)
    assert r.demand == pytest.approx(8_000 * 40 / 30)
    assert r.per_group_c == 15  # no histogram sum: the running gauge per serving group
    assert r.mean_latency is None
    idle = obs(0, tok_s=8_000, running=0, latency=0.004)
    assert read(idle, 0.004, MODEL, 1, TARGET, per_step=False).demand == pytest.approx(8_000)  # no queue factor


def test_little_law_concurrency_from_the_histogram_sum_in_the_targets_unit():
    """4 tokens a step of 16 ms: 4 ms a token. 5000 tok/s x 4 ms = 20 requests, 10 a group of 2,
    whatever the gauge says; per step the demand is 1250 request-steps/s at 16 ms a step."""
    step = 0.016
    itl = Histogram({step * 0.999: 0, step: 1000, INF: 1000}, sum=step * 1000)
    o = DecodeObservation(at=0, window_s=30, itl=itl, itl_metric="vllm:inter_token_latency_seconds",
                          running=999, drafts=1000, accepted=3000, generation_tokens=5_000 * 30)
    token = read(o, 0.004, MODEL, 2, TARGET, per_step=False)
    assert (token.per_group_c, token.mean_latency) == (pytest.approx(10.0), pytest.approx(0.004))
    assert token.demand == pytest.approx(5_000)
    per_step = read(o, 0.016, MODEL, 2, 0.02, per_step=True)
    assert (per_step.per_group_c, per_step.mean_latency) == (pytest.approx(10.0), pytest.approx(0.016))
    assert per_step.demand == pytest.approx(5_000 / 4)


def test_panic_sizes_a_saturated_fleet_from_the_requests_running_now():
    """At 3x the target the window's 6000 tok/s lags the jump: the 600 requests running and
    waiting now at the window's 15 ms are 40000 tok/s."""
    o = obs(0, tok_s=6_000, running=450, waiting=150, latency=0.015)
    assert read(o, 0.015, MODEL, 3, TARGET, per_step=False).demand == pytest.approx(600 / 0.015)


def test_panic_reads_the_slower_of_the_window_and_the_batch_now():
    """A window that began before the jump holds faster steps (8 ms) than the 200 requests a
    group make now take (the model's mean, 12.5 ms): 600 / 12.5 ms, not 600 / 8 ms."""
    o = obs(0, tok_s=6_000, running=600, latency=0.008)
    assert MODEL.mean_latency(200, 3) == pytest.approx(0.0125)
    assert panic(6_000, o, 0.008, MODEL, 3, TARGET) == pytest.approx(600 / 0.0125)


def test_no_panic_up_to_the_saturated_level_nor_below_the_window():
    o = obs(0, tok_s=6_000, running=450, waiting=150, latency=0.015)
    assert SATURATED == 1.5
    assert panic(6_000, o, SATURATED * TARGET, MODEL, 3, TARGET) == 6_000  # at 1.5 T: not saturated
    assert panic(6_000, o, None, MODEL, 3, TARGET) == 6_000
    assert panic(90_000, o, 0.015, MODEL, 3, TARGET) == 90_000  # the window says more: it stands
