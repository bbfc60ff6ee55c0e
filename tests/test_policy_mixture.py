"""The per-token latency as a mixture of decode-only and chunk steps (autoscaler/policy/model.py,
issue 23): the chunk-step token share from the prompt tokens/s and the mean chunk, the predicted
P90 switching from the decode steps to the chunk step at a token share of 1 - q, the capacity
and the group count found from it, the mean chunk learned from the prompts, and the seed's
chunk step from the perf model."""

from __future__ import annotations

import math
from statistics import NormalDist

import pytest

from kimik3.admission import admit
from kimik3.autoscaler.policy.model import GroupLatencyModel
from kimik3.autoscaler.seed import chunk_step_overhead, seed_model
from test_policy_prefill import recipe_spec

# A line of 2 ms + 0.5 ms per request (no spread: z = w = 0), 4 tokens per step, chunks of 8000
# prompt tokens at 10 us each plus a 20 ms fixed part: a chunk adds 100 ms to its step, 25 ms per
# token; theta' = 10 us + 20 ms / 8000 = 12.5 us per prompt token.
MODEL = dict(t0=0.002, k=0.0005, theta=1e-5, chunk_theta=1e-5, chunk_step_s=0.02, chunk_tokens=8000.0,
             al=4.0, q=0.9, budget=8192)


def share(pi: float, c: float = 4.0) -> float:
    """The chunk steps' token share by hand: (pi / C) d / (1 - (pi / C) 100 ms), d = 4 (2 + 0.5 c) ms."""
    return pi / 8000 * 4 * (0.002 + 0.0005 * c) / (1 - pi / 8000 * 0.1)


def test_the_chunk_steps_token_share_and_time():
    m = GroupLatencyModel(**MODEL)
    assert m.chunk_extra() == pytest.approx(0.1) and m.chunk_latency() == pytest.approx(0.025)
    # 19,048 prompt tokens/s at 4 requests: 2.38 chunk steps/s take 23.8% of the time; their
    # 16 ms decode parts against the 47.6 decode-only steps/s left: 5% of the tokens.
    assert m.chunk_share(4, 19_047.6) == pytest.approx(share(19_047.6)) == pytest.approx(0.05, abs=1e-6)
    assert m.chunk_share(4, 0) == 0.0
    assert m.stretch(19_047.6) == pytest.approx(1 / (1 - 19_047.6 * 1.25e-5))  # 1.313
    # No chunk term (chunk_theta 0): no chunk steps, whatever the prompts.
    assert GroupLatencyModel(**{**MODEL, "chunk_theta": 0.0}).chunk_share(4, 19_047.6) == 0.0


def test_the_p90_is_the_decode_steps_under_a_1_minus_q_share_and_the_chunk_step_past_it():
    m = GroupLatencyModel(**MODEL)
    switch = 0.1 / (4 * 0.004 / 8000 + 0.1 * 0.1 / 8000)  # share(pi) = 0.1 at c = 4: 30,769 tokens/s
    assert share(switch) == pytest.approx(0.1)
    assert m.chunk_reach(switch) == pytest.approx(4.0)
    # At a 5% share the P90 is the decode steps' 0.9 / 0.95 quantile: 0.338 more standard
    # deviations of the batch (sqrt(4) = 2 requests), on the stretched line.
    deeper = NormalDist().inv_cdf(0.9 / 0.95) - NormalDist().inv_cdf(0.9)
    assert m.deeper(4, 19_047.6) == pytest.approx(deeper, rel=1e-4) == pytest.approx(0.338, abs=1e-3)
    assert m.latency(4, 1, pi=19_047.6) == pytest.approx((0.002 + 0.0005 * (4 + 2 * deeper)) * m.stretch(19_047.6),
                                                         rel=1e-4)  # 5.69 ms
    # Just under the switch: still the decode steps (under the chunk step's 4 + 25 = 29 ms).
    below, above = m.latency(4, 1, pi=0.99 * switch), m.latency(4, 1, pi=1.01 * switch)
    assert share(0.99 * switch) < 0.1 < share(1.01 * switch)
    assert below < 0.029
    assert above == pytest.approx(0.004 + 0.025)  # the chunk step: the line plus 25 ms
    # Without prompts: the plain line.
    assert m.latency(4, 1) == pytest.approx(0.004)


def test_a_chunk_step_under_the_target_is_accepted():
    # Short chunks: 200 tokens, no fixed part: 2 ms a step, 0.5 ms per token.
    m = GroupLatencyModel(**{**MODEL, "chunk_step_s": 0.0, "chunk_tokens": 200.0})
    assert m.chunk_latency() == pytest.approx(0.0005)
    pi = 20_000  # 100 chunk steps/s: 20% of the time, a share past 10% at any batch from 1 on
    reach = m.chunk_reach(pi)
    assert reach < 1
    # Past the reach the quantile is the chunk step, max(line x 1.25, line + 0.5 ms): under 6 ms
    # up to a line of 4.8 ms (c = 5.6), where line x 1.25 = 6 ms.
    assert m.latency(5, 1, pi=pi) == pytest.approx(max(0.0045 * 1.25, 0.0045 + 0.0005))
    assert m.capacity(0.006, 1, pi) == pytest.approx(5.6, rel=1e-6)


def test_the_capacity_stops_where_chunk_steps_reach_1_minus_q_while_they_break_the_target():
    m = GroupLatencyModel(**MODEL)
    pi = 19_047.6
    reach = m.chunk_reach(pi)  # a 10% share at 12 requests (d = 32 ms)
    assert reach == pytest.approx(12.0, rel=1e-5) and share(pi, reach) == pytest.approx(0.1)
    # A 30 ms target: the decode steps hold it up to the reach (their deepest quantile, 5.75
    # standard deviations, is 23.5 ms there); past it the chunk step takes 8 + 25 = 33 ms.
    assert m.capacity(0.030, 1, pi) == pytest.approx(reach, rel=1e-5)
    assert m.latency(reach * 1.001, 1, pi=pi) == pytest.approx(0.002 + 0.0005 * reach * 1.001 + 0.025)
    # A tight one binds first, on the decode steps: the capacity is where their quantile meets it.
    tight = m.capacity(0.005, 1, pi)
    assert tight < reach and m.latency(tight, 1, pi=pi) == pytest.approx(0.005, rel=1e-6)


def test_the_groups_asked_for_are_the_fewest_that_bring_the_chunk_share_under_1_minus_q():
    m = GroupLatencyModel(**MODEL)
    demand, prefill, target = 2_000.0, 200_000.0, 0.006
    assert m.groups_for(demand, target, 32, prefill=prefill) == 6
    c5, c6 = m.concurrency(demand, 5, prefill), m.concurrency(demand, 6, prefill)
    # 5 groups: chunk steps hold 13.3% of the tokens: the P90 is theirs, the line plus 25 ms.
    assert m.chunk_share(c5, prefill / 5) == pytest.approx(0.1333, abs=1e-4)
    assert m.predict(demand, 5, prefill=prefill) == pytest.approx(0.002 + 0.0005 * c5 + 0.025)  # 28.3 ms
    # 6 groups: 8%, the decode steps' 0.978 quantile: 5.13 ms.
    assert m.chunk_share(c6, prefill / 6) == pytest.approx(0.08, abs=1e-4)
    assert m.predict(demand, 6, prefill=prefill) == pytest.approx(0.005126, abs=1e-6)
    assert m.groups_for(demand, 0.005, 32, prefill=prefill) == 7


def test_the_mean_chunk_is_learned_from_the_prompts_and_a_chunk_steps_quantile_not_fitted_to_the_line():
    m = GroupLatencyModel(**{**MODEL, "forget": 0.5})
    m.observe_prompts(14_361 * 100, 100, 4.26)  # the agentic trace's mean prompt: E[ceil(L / B)] = 2.25
    assert m.chunk_tokens == pytest.approx(14_361 / (14_361 / 8192 + 0.5)) == pytest.approx(6374, abs=1)
    assert m.al == 4.26
    m.observe_prompts(2_000 * 300, 300, 4.26)  # short prompts: one chunk each; half the old weight
    mean = (0.5 * 14_361 * 100 + 2_000 * 300) / (0.5 * 100 + 300)
    assert m.chunk_tokens == pytest.approx(mean / max(1.0, mean / 8192 + 0.5))
    m.observe_prompts(0, 0, 4.0)  # no prompts: the chunk stays, the acceptance length follows
    assert m.chunk_tokens == pytest.approx(mean / max(1.0, mean / 8192 + 0.5)) and m.al == 4.0

    fitted = GroupLatencyModel(**{**MODEL, "seed_c": 8.0, "prior_weight": 1.0})
    line = (fitted.t0, fitted.k, fitted.theta)
    pi = 40_000  # a 16% share at c = 4: the P90 is the chunk step, ~29 ms
    fitted.update(4, fitted.latency(4, 1, pi=pi), 1, None, pi)
    assert (fitted.t0, fitted.k, fitted.theta) == pytest.approx(line)


def test_the_seed_takes_the_chunk_step_from_the_perf_model():
    admitted = admit(recipe_spec())
    m = seed_model(admitted)
    assert chunk_step_overhead(admitted) == pytest.approx(0.01893, abs=1e-5)  # the experts a chunk streams
    assert (m.chunk_step_s, m.chunk_theta, m.chunk_tokens, m.budget, m.q) == (
        chunk_step_overhead(admitted), m.theta, 8192.0, 8192, 0.9)
    assert m.al == pytest.approx(4.26, abs=0.01)  # DSpark's acceptance length
    # A full chunk: 129 ms a step, 30 ms per token on top of the decode step.
    assert m.chunk_extra() == pytest.approx(0.1288, abs=1e-4)
    assert m.chunk_latency() == pytest.approx(0.1288 / 4.26, abs=1e-4)
    assert not math.isinf(m.stretch(50_000))
