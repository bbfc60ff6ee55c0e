"""Prefill in the policy's model (autoscaler/policy/model.py, ttft.py, seed.py) and the TTFT
target's admission (issue 23 items 1 and 2): values of the prefill term, the capacity per group
found from both load dimensions, what is learned online, and bad input naming its field."""

from __future__ import annotations

import math

import pytest

from kimik3.admission import admit
from kimik3.api.errors import SpecErrors
from kimik3.autoscaler.factory import policy_settings
from kimik3.autoscaler.policy.model import GroupLatencyModel
from kimik3.autoscaler.policy.ttft import TTFTModel
from kimik3.autoscaler.seed import prefill_terms, seed_ttft

# A line of 2 ms + 0.5 ms per request, 10 us of a group's time per prompt token, prefill capped at 80%.
MODEL = dict(t0=0.002, k=0.0005, theta=1e-5, max_prefill_share=0.8)


def test_prefill_stretches_the_latency_by_its_share_of_the_groups_time():
    m = GroupLatencyModel(**MODEL)
    assert m.latency(4, 1) == pytest.approx(0.004)
    # 20k prompt tokens/s take 20% of the group: (2 + 0.5 x 4) ms / 0.8 = 5 ms.
    assert m.latency(4, 1, pi=20_000) == pytest.approx(0.005)
    assert m.stretch(20_000) == pytest.approx(1.25)
    assert m.stretch(80_000) == math.inf  # vLLM's token budget: 80% is the most prefill may take
    assert m.mean_latency(4, 1, pi=20_000) == pytest.approx(0.005)


def test_the_capacity_per_group_is_found_from_both_dimensions():
    m = GroupLatencyModel(**MODEL)
    assert m.capacity(0.005, 1) == pytest.approx(6.0)  # (5 - 2) / 0.5
    assert m.capacity(0.005, 1, pi=20_000) == pytest.approx(4.0)  # 4 ms of decode left under the stretch
    assert m.capacity(0.005, 1, pi=60_000) == 0.0  # 5 ms / 2.5 = 2 ms: the floor alone
    # Little's law with both: 2 groups, 1000 tok/s and 40k prompt tokens/s (20k each, stretch 1.25):
    # c = 1000 x 1.25 x 2 ms / (2 - 1000 x 0.5 ms x 1.25) = 1.818, latency (2 + 0.5 c) x 1.25 ms.
    c = 1000 * 1.25 * 0.002 / (2 - 1000 * 0.0005 * 1.25)
    assert m.concurrency(1000, 2, prefill=40_000) == pytest.approx(c)
    assert m.predict(1000, 2, prefill=40_000) == pytest.approx((0.002 + 0.0005 * c) * 1.25)
    # The same output tokens need more groups with the prompts: 1 without (4 ms), 3 with 60k prompt
    # tokens/s (2 give (2 + 0.5 x 2.22) ms / 0.7 = 4.44 ms).
    assert m.groups_for(1000, 0.0042, 10) == 1
    assert m.predict(1000, 2, prefill=60_000) == pytest.approx(0.00444, abs=1e-5)
    assert m.groups_for(1000, 0.0042, 10, prefill=60_000) == 3
    assert m.predict(1000, 1, prefill=80_000) == math.inf  # prefill past its share: saturated


def test_theta_is_learned_from_windows_whose_prompt_share_varies():
    true = GroupLatencyModel(t0=0.002, k=0.0005, theta=3e-5)
    m = GroupLatencyModel(t0=0.0018, k=0.0006, theta=1e-5, seed_c_low=1, seed_c=8, forget=0.98, prior_weight=1.0)
    for i in range(200):
        c, pi = 2 + (i % 5), 2_000 * (i % 7)
        m.update(c, true.latency(c, 1, pi=pi), 1, true.mean_latency(c, 1, pi=pi), pi)
    # The prior (10x the line's: THETA_PRIOR) holds theta short of the truth, the line takes the rest.
    assert 2e-5 < m.theta < 3e-5
    for c, pi in ((4, 10_000), (6, 3_000), (3, 12_000)):
        assert m.latency(c, 1, pi=pi) == pytest.approx(true.latency(c, 1, pi=pi), rel=0.1)  # the prior's bias: 8% at (4, 10k)


def test_without_prompt_tokens_theta_keeps_its_seed():
    m = GroupLatencyModel(t0=0.002, k=0.0005, theta=1e-5, seed_c_low=1, seed_c=8, forget=0.98, prior_weight=1.0)
    for c in (2, 4, 6) * 20:
        m.update(c, 0.0025 + 0.0006 * c, 1)
    assert m.theta == pytest.approx(1e-5)
    assert m.k == pytest.approx(0.0006, rel=0.05)


def recipe_spec(**autoscaling):
    import yaml
    with open("recipes/gb300-tp8-megakernel-dspark.yaml", encoding="utf-8") as fh:
        doc = next(d for d in yaml.safe_load_all(fh) if d and d.get("kind") == "KimiK3Deployment")
    spec = dict(doc["spec"])
    spec["autoscaling"] = {"enabled": True, "maxReplicas": 8, "metricsSource": {"type": "podScrape"}, **autoscaling}
    return spec


def test_the_seed_takes_prefill_from_the_perf_model_and_vllms_token_budget():
    admitted = admit(recipe_spec())
    theta, step, budget, share = prefill_terms(admitted)
    assert theta == pytest.approx(1 / (26_200 * 37 / 104 * 8))  # the perf model's 74.6k prompt tokens/s on TP8
    assert budget == 8192 and step == pytest.approx(0.01578, abs=1e-4)  # the decode step at the 5 ms target
    assert share == pytest.approx(budget * theta / (step + budget * theta))  # 0.874
    ttft = seed_ttft(admitted)
    assert (ttft.theta, ttft.step_s, ttft.budget, ttft.base) == (theta, step, budget, None)


def test_the_ttft_model_learns_its_base_and_sizes_the_prefill_queue():
    m = TTFTModel(theta=1e-5, step_s=0.02, budget=8000)  # busy share: pi x (10 + 2.5) us
    assert m.predict(100_000, 1) == 0.0 and m.groups_for(100_000, 1.0, 8) == 1  # nothing measured: asks for none
    m.update(0.8, 40_000)  # 50% busy: the base is 0.4 s
    assert m.base == pytest.approx(0.4)
    assert m.predict(160_000, 4) == pytest.approx(0.8)
    assert m.predict(160_000, 2) == math.inf  # 80k/s per group: every step full
    assert m.groups_for(160_000, 0.5, 32) == 10  # 16k/s per group: 20% busy, 0.5 s
    assert m.groups_for(160_000, 0.5, 9) is None
    assert not m.reachable(0.4) and m.groups_for(1_000, 0.3, 32) is None  # below the base: groups cannot help
    m.update(0.5, 0.0)
    assert m.base == pytest.approx(0.9 * 0.4 + 0.1 * 0.5)


def test_the_ttft_target_is_admitted_into_the_policys_settings():
    admitted = admit(recipe_spec(ttftTarget={"percentile": 95, "value": "1500ms"}))
    assert admitted.seconds.ttft_target == 1.5
    settings = policy_settings(admitted)
    assert (settings.ttft_target_s, settings.ttft_percentile) == (1.5, 0.95)
    assert policy_settings(admit(recipe_spec())).ttft_target_s is None


@pytest.mark.parametrize("ttft,field,message", [
    ({"value": "0s"}, "spec.autoscaling.ttftTarget.value", "ttftTarget.value must be above 0"),
    ({"value": "2 s"}, "spec.autoscaling.ttftTarget.value", "is not a duration"),
    ({"percentile": 100, "value": "2s"}, "spec.autoscaling.ttftTarget.percentile", "99"),
    ({"percentile": 90}, "spec.autoscaling.ttftTarget.value", "required"),
])
def test_a_bad_ttft_target_is_refused_naming_the_field(ttft, field, message):
    with pytest.raises(SpecErrors) as refused:
        admit(recipe_spec(ttftTarget=ttft))
    text = str(refused.value)
    assert field in text and message.lower() in text.lower(), text
