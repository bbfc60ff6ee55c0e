"""The performance model against the published Kimi K3 GB300 figures (kimi-k3-and-vllm.md)."""

from __future__ import annotations

import random

import pytest

from kimik3.admission import admit
from kimik3.autoscaler import perfmodel as pm
from kimik3.autoscaler.perfmodel import EngineShape, decode_point

WITHIN = 0.02


def shape(tp: int, method: str = "none", k: int = 0, backend: str = "stock") -> EngineShape:
    return EngineShape(tensor_parallel_size=tp, spec_method=method, num_speculative_tokens=k, decode_backend=backend)


@pytest.mark.parametrize(("tp", "method", "k", "backend", "workload", "published"), [
    (8, "none", 0, "stock", "chat", 111.0),           # TP8, no speculation
    (16, "none", 0, "stock", "chat", 118.0),          # TP16, no speculation
    (8, "dspark", 7, "stock", "blog", 331.0),         # TP8 + DSpark (blog workload, AL 4.47)
    (16, "dspark", 7, "stock", "blog", 370.0),        # TP16 + DSpark
    (16, "dspark", 7, "latency_specialized", "news", 423.0),  # megakernel path (news workload, AL 3.02)
    (16, "dspark", 7, "latency_specialized", 6.0, 840.0),     # 16 GB300, synthetic AL 6
])
def test_batch1_reproduces_each_published_figure(tp, method, k, backend, workload, published):
    got = decode_point(shape(tp, method, k, backend), 1, workload).tokens_per_s_per_user
    assert got == pytest.approx(published, rel=WITHIN)


def test_megakernel_gain_is_the_published_168x_at_equal_acceptance():
    for workload in ("news", "chat", "code"):
        stock = decode_point(shape(16, "dspark", 7), 1, workload).tokens_per_s_per_user
        mk = decode_point(shape(16, "dspark", 7, "latency_specialized"), 1, workload).tokens_per_s_per_user
        assert mk / stock == pytest.approx(pm.MK_GAIN_PUBLISHED, rel=WITHIN)


def test_inferred_constants_are_consistent_with_the_reference():
    # the blog workload's AL lies between Dynamo's 4.26 and code's 4.7
    assert pm.AL_DSPARK["chat"] < pm.AL_BLOG < pm.AL_DSPARK["code"]
    assert pm.STEP_STOCK_TP16_DSPARK == pytest.approx(0.01209)
    # the megakernel shrinks the latency floor about like the per-layer figure (69/130 = 0.53)
    assert pm.MK_FLOOR_FACTOR == pytest.approx(pm.LAYER_US_MK / pm.LAYER_US_STOCK, rel=0.06)
    # every calibrated configuration keeps a positive latency floor
    for tp in (8, 16):
        for method, k in (("none", 0), ("dspark", 7)):
            for backend in ("stock", "latency_specialized"):
                assert pm.perf_params(shape(tp, method, k, backend)).floor_s > 0.003


@pytest.mark.parametrize(("workload", "al"), [("code", 4.7), ("creative", 2.6), ("chat", 4.26)])
def test_dspark_acceptance_length_by_workload(workload, al):
    assert pm.acceptance_length("dspark", 7, workload) == pytest.approx(al, rel=1e-6)
    point = decode_point(shape(8, "dspark", 7, "latency_specialized"), 1, workload)
    assert point.tokens_per_step == pytest.approx(al, rel=1e-6)
    # per-position acceptance falls with position and sums to AL - 1
    pos = pm.per_position_acceptance("dspark", 7, workload)
    assert pos == sorted(pos, reverse=True)
    assert sum(pos) == pytest.approx(al - 1, rel=1e-6)


def test_code_beats_creative_and_fewer_drafts_accept_less():
    s = shape(8, "dspark", 7, "latency_specialized")
    assert decode_point(s, 1, "code").tokens_per_s_per_user > decode_point(s, 1, "creative").tokens_per_s_per_user
    assert pm.acceptance_length("dspark", 3, "code") < pm.acceptance_length("dspark", 7, "code")
    assert pm.acceptance_length("dspark", 8, "code") > pm.acceptance_length("dspark", 7, "code")
    assert pm.acceptance_length("none", 0) == 1.0


def test_sampled_acceptance_matches_the_mean():
    rng = random.Random(7)
    p = pm.acceptance_rate("dspark", 7, "chat")
    mean = 1 + sum(pm.sample_accepted(p, 7, rng) for _ in range(20000)) / 20000
    assert mean == pytest.approx(4.26, rel=0.03)


@pytest.mark.parametrize("s", [shape(8), shape(16), shape(8, "dspark", 7), shape(16, "dspark", 7, "latency_specialized"),
                               EngineShape(strategy="dep", tensor_parallel_size=1, data_parallel_size=16,
                                           expert_parallel=True)])
def test_slows_with_batch_and_throughput_still_grows(s):
    points = [decode_point(s, b) for b in (1, 2, 4, 8, 16, 32, 64, 128, 256)]
    steps = [p.step_s for p in points]
    per_user = [p.tokens_per_s_per_user for p in points]
    group = [p.group_tokens_per_s for p in points]
    assert steps == sorted(steps) and len(set(steps)) == len(steps)
    assert per_user == sorted(per_user, reverse=True)
    assert group == sorted(group)
    assert per_user[-1] < per_user[0] / 2  # batch 256 at least halves per-user speed


def test_speculative_gain_shrinks_with_batch():
    def gain(batch: int) -> float:
        return (decode_point(shape(8, "dspark", 7), batch).tokens_per_s_per_user
                / decode_point(shape(8), batch).tokens_per_s_per_user)

    assert gain(1) == pytest.approx(315 / 111, rel=0.05)  # ~3x at batch 1 (autoscaling.md)
    assert gain(1) > gain(4) > gain(16) > 1.0
    assert 1.0 < gain(256) < gain(1) / 1.5  # beyond ~100 verified tokens both pay the full expert stream


def test_step_time_formula_and_ttft():
    p = pm.perf_params(shape(8, "dspark", 7))
    n = 4 * 8
    expected = p.floor_s + p.expert_stream_s * pm.expert_coverage(n) + p.per_token_s * n
    assert pm.step_time(p, 4) == pytest.approx(expected)
    assert pm.step_time(p, 0) == 0.0
    # TTFT grows with prompt length at the prefill rate, and with the running batch
    t1, t2 = pm.ttft(p, 1000), pm.ttft(p, 9000)
    assert t2 - t1 == pytest.approx(8000 / p.prefill_tokens_per_s, rel=0.05)
    assert pm.ttft(p, 1000, batch_per_engine=64) > t1
    assert 0.02 < t1 < 0.2


def test_from_spec_of_the_recipes():
    recipe = {"model": {"source": {"pvc": {"claimName": "w"}}},
              "engine": {"decodeBackend": "latency_specialized"},
              "speculativeDecoding": {"method": "dspark", "draftModel": "/models/Kimi-K3-DSpark",
                                      "numSpeculativeTokens": 7},
              "topology": {"accelerator": "gb300", "strategy": "tp", "tensorParallelSize": 8}}
    s = EngineShape.from_spec(admit(recipe).spec, admit(recipe).plan)
    assert (s.tensor_parallel_size, s.spec_method, s.k, s.decode_backend) == (8, "dspark", 7, "latency_specialized")
    dep_admitted = admit({"model": {"source": {"pvc": {"claimName": "w"}}},
                          "topology": {"strategy": "dep", "dataParallelSize": 16}})
    dep = EngineShape.from_spec(dep_admitted.spec, dep_admitted.plan)
    p = pm.perf_params(dep)
    assert (p.engines_per_unit, p.units, p.gpus_per_unit) == (16, 1, 16)
    # DEP at batch 1 is slower per user than TP16 (recipe comment), faster in aggregate at large batch
    assert decode_point(dep, 1).tokens_per_s_per_user < decode_point(shape(16), 1).tokens_per_s_per_user
    assert decode_point(dep, 64).group_tokens_per_s > decode_point(shape(16), 64).group_tokens_per_s
