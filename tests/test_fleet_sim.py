"""The fleet simulator, traces, baselines and benchmark output (issue 4, part 4), on short runs."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from kimik3.admission import admit
from kimik3.autoscaler.histogram import Histogram, quantile
from kimik3.autoscaler.observation import (ACCEPTED, DRAFTS, GENERATION_TOKENS, ITL, PREFIX_CACHE_HITS, PROMPT_TOKENS,
                                           RUNNING, TTFT, DecodeObservation)
from kimik3.engine.metrics import WAITING
from kimik3.autoscaler.perfmodel import acceptance_length, decode_point, perf_params
from kimik3.autoscaler.policy import Decision, FleetState
from kimik3_dev.benchmark import simulate as benchmark, traces
from kimik3_dev.benchmark import peers
from kimik3_dev.benchmark.baselines import (ConstantNext, HPAPolicy, KalmanTrend, KEDASLOPolicy, KPAPolicy,
                                            OptimalPolicy, StaticPolicy, provisioning_schedule)
from kimik3_dev.benchmark.fleet import FleetConfig, FleetSim, GatewayReading, GroupModel
from kimik3_dev.sim.vllm_metrics import BY_NAME

RECIPE = "recipes/gb300-tp8-megakernel-dspark.yaml"


@pytest.fixture(scope="module")
def setup():
    return benchmark.setup(RECIPE)


def _sim(s, policy, reqs, duration, initial, cfg=None):
    return FleetSim(cfg or s.cfg, policy, reqs, duration, initial, model=GroupModel(cfg or s.cfg)).run()


class Scripted:
    """A policy that asks for ``plan[t]`` groups from time t on, and records what it saw."""

    def __init__(self, plan: dict[float, int], interval_s: float = 30.0):
        self.plan, self.interval_s, self.window_s = sorted(plan.items()), interval_s, 120.0
        self.seen: list[tuple[float, DecodeObservation | None, FleetState]] = []

    def decide(self, now, obs, fleet):
        self.seen.append((now, obs, fleet))
        want = fleet.current
        for t, n in self.plan:
            if now >= t:
                want = n
        return Decision(want, "Scripted")


def test_recipe_fleet_config(setup):
    cfg = setup.cfg
    assert (cfg.shape.tensor_parallel_size, cfg.shape.decode_backend, cfg.shape.spec_method) == (8, "latency_specialized", "dspark")
    assert (cfg.max_num_seqs, cfg.trays_per_group, cfg.gpus_per_group, cfg.capacity_groups) == (64, 2, 8, 18)
    assert cfg.load_time_s == 900.0
    assert not cfg.exclusive  # the benchmark deploys the recipe with its Kueue block (simulate.BENCH_PLACEMENT)


def test_the_recipes_own_exclusive_placement_takes_a_rack_per_group(setup):
    """The recipe as shipped (placement exclusive): 2 racks hold 2 groups, the 3rd waits unplaceable."""
    with open(RECIPE, encoding="utf-8") as fh:
        doc = next(d for d in yaml.safe_load_all(fh) if d and d.get("kind") == "KimiK3Deployment")
    cfg = FleetConfig.from_admitted(admit(doc["spec"]))
    assert (cfg.exclusive, cfg.trays_taken, cfg.capacity_groups) == (True, 18, 2)
    cfg = replace(cfg, load_time_s=60.0)
    policy = Scripted({30: 3})
    res = _sim(setup, policy, [], 300, 1, cfg=cfg)
    states = {now: fleet for now, _, fleet in policy.seen}
    assert states[120.0] == FleetState(current=3, ready=2, loading=0, unplaceable=1, serving=frozenset({"0", "1"}),
                                       load_time_s=60.0)
    assert res.gpu_hours == pytest.approx((300 + 270) * 8 / 3600)  # the waiting group holds no GPUs


def test_a_static_group_at_a_known_batch_has_the_perf_models_latency(setup):
    """Four long requests at t=0 on one group: every decode token comes at tpot(batch 4)."""
    reqs = [traces.Request(0.001 * i, 16, 20_000) for i in range(4)]
    res = _sim(setup, StaticPolicy(1), reqs, 60, 1)
    params = perf_params(setup.cfg.shape)
    point = decode_point(params, 4)
    assert res.minutes[0].p90_tpot_s == pytest.approx(point.tpot_s, abs=2e-6)
    assert point.tpot_s == pytest.approx(0.004366, abs=1e-5)  # 229 tok/s per user at batch 4
    # 60 s at 4 x 229 tok/s, less the one prefill step: the group's throughput.
    assert res.minutes[0].tokens == pytest.approx(60 * point.group_tokens_per_s, rel=0.01)
    assert res.gpu_hours == pytest.approx(8 * 60 / 3600)


def test_the_observation_is_what_vllm_would_export(setup):
    """ITL is per engine step (AL tokens), spec-decode counters give the acceptance length back."""
    reqs = [traces.Request(0.001 * i, 16, 60_000) for i in range(4)]
    policy = Scripted({})
    _sim(setup, policy, reqs, 150, 1)
    now, obs, fleet = policy.seen[-1]
    al = acceptance_length("dspark", 7)
    point = decode_point(perf_params(setup.cfg.shape), 4)
    assert (now, obs.window_s, fleet) == (150.0, 120.0, FleetState(current=1, ready=1, serving=frozenset({"0"}),
                                                                   load_time_s=900.0))
    assert obs.acceptance_length == pytest.approx(al, rel=1e-6)  # 4.26 (Dynamo's chat figure)
    assert obs.running == 4 and obs.waiting == 0
    assert obs.generation_tokens / obs.window_s == pytest.approx(point.group_tokens_per_s, rel=1e-3)
    # Steps of 18.6 ms in 1 ms buckets: the quantile lands inside the step's bucket.
    assert point.step_s == pytest.approx(0.0186, abs=1e-4)
    assert 0.018 <= quantile(0.9, obs.itl) <= 0.019
    assert obs.itl.count == pytest.approx(4 * 120 / point.step_s, rel=1e-3)


def test_groups_serve_vllm_pages_that_the_operators_own_source_reads(setup, monkeypatch):
    """Each group's /metrics page is vLLM 0.32's (names, types, labels, the ITL bucket layout);
    the observation is the operator's PodScrapeSource reading of those pages, so a bug in the
    operator's histogram code changes what the policy sees."""
    reqs = [traces.Request(0.001 * i, 16, 60_000) for i in range(4)]
    sim = FleetSim(setup.cfg, Scripted({}), reqs, 150, 1, model=setup.model)
    sim.run()
    families = {f.name: f for f in text_string_to_metric_families(sim.page(sim.groups[0].url))}
    assert set(families) == {ITL, RUNNING, WAITING, GENERATION_TOKENS, DRAFTS, ACCEPTED, PROMPT_TOKENS,
                             PREFIX_CACHE_HITS, TTFT}
    assert families[PROMPT_TOKENS].samples[0].value == 4 * 16  # four prompts of 16 tokens
    assert families[PREFIX_CACHE_HITS].samples[0].value == 0  # no prefix cache simulated
    assert [x.value for x in families[TTFT].samples if x.name.endswith("_count")] == [4]
    for f in families.values():
        assert f.type == BY_NAME[f.name].kind
        assert {frozenset(x.labels) - {"le"} for x in f.samples} == {frozenset(BY_NAME[f.name].labels)}
    bounds = [float(x.labels["le"]) for x in families[ITL].samples if x.name.endswith("_bucket")]
    assert bounds == [*setup.cfg.itl_buckets, float("inf")]
    assert families[RUNNING].samples[0].value == 4

    right, broken = Scripted({}), Scripted({})
    _sim(setup, right, reqs, 150, 1)
    monkeypatch.setattr(Histogram, "__sub__", lambda new, old: new)  # a bug: no differencing
    _sim(setup, broken, reqs, 150, 1)
    (_, ok, _), (_, bad, _) = right.seen[-1], broken.seen[-1]
    assert bad.itl.count == pytest.approx(ok.itl.count * 150 / 120, rel=0.02)  # since t = 0, not 2 min


def test_a_group_added_loads_for_exactly_the_load_time(setup):
    cfg = replace(setup.cfg, load_time_s=120.0)
    policy = Scripted({30: 2})
    res = _sim(setup, policy, [], 300, 1, cfg=cfg)
    assert res.groups[1][1:] == (30.0, 150.0, None)  # created at 30 s, ready at 150 s
    assert res.groups[0][1:] == (-120.0, 0.0, None)  # the first group loaded before the run: it serves at 0
    states = {now: fleet for now, _, fleet in policy.seen}
    assert states[60.0] == FleetState(current=2, ready=1, loading=1, serving=frozenset({"0"}), load_time_s=120.0)
    # decisions come before readiness
    assert states[150.0] == FleetState(current=2, ready=1, loading=1, serving=frozenset({"0"}), load_time_s=120.0)
    assert states[180.0] == FleetState(current=2, ready=2, serving=frozenset({"0", "1"}), load_time_s=120.0)
    # GPU-hours count the loading group: 300 s x 8 GPUs + 270 s x 8 GPUs.
    assert res.gpu_hours == pytest.approx((300 + 270) * 8 / 3600)
    assert res.scale_events == 1


def test_capacity_limits_placement(setup):
    """One rack of 4 trays holds 2 groups of 2 trays: the 3rd and 4th stay pending until a
    group is removed; pending groups hold no GPUs."""
    cfg = replace(setup.cfg, racks=1, trays_per_rack=4, load_time_s=60.0)
    assert cfg.capacity_groups == 2
    assert replace(setup.cfg, quota_gpus=16).capacity_groups == 2  # the tenant's ClusterQueue, not the racks
    policy = Scripted({30: 4, 300: 3})
    res = _sim(setup, policy, [], 600, 1, cfg=cfg)
    states = {now: fleet for now, _, fleet in policy.seen}
    assert states[120.0] == FleetState(current=4, ready=2, loading=0, unplaceable=2, serving=frozenset({"0", "1"}),
                                       load_time_s=60.0)
    # At 300 s the newest (pending) group goes; the other pending one still has no room.
    assert states[330.0] == FleetState(current=3, ready=2, loading=0, unplaceable=1, serving=frozenset({"0", "1"}),
                                       load_time_s=60.0)
    assert res.gpu_hours == pytest.approx((600 + 570) * 8 / 3600)  # group 1 from 30 s; none pending


def test_scale_down_drains_the_newest_group(setup):
    reqs = [traces.Request(0.5 * i, 16, 400) for i in range(100)]
    res = _sim(setup, Scripted({60: 1}), reqs, 120, 2)
    created_ready_gone = {g[0]: g[1:] for g in res.groups}
    assert created_ready_gone[0] == (-900.0, 0.0, None)  # loaded before the run
    assert created_ready_gone[1][2] is not None and 60.0 <= created_ready_gone[1][2] < 65.0


def test_traces_are_deterministic_and_have_their_shape():
    full = traces.step()
    assert full.rate(1799) == 4.0 and full.rate(1860) == 16.0 and full.rate(6000) == 4.0
    assert full.jumps == (1800.0,) and full.duration_s == 7200
    step = traces.step(at_s=300, hold_s=300, duration_s=900)
    a, b = step.requests(0), step.requests(0)
    assert a == b and a != step.requests(1)
    assert len(a) == pytest.approx(sum(step.rates), rel=0.03)
    mean_out = sum(r.output_tokens for r in a) / len(a)
    mean_prompt = sum(r.prompt_tokens for r in a) / len(a)
    assert mean_out == pytest.approx(400, rel=0.03) and mean_prompt == pytest.approx(2000, rel=0.03)
    d = traces.diurnal()
    assert d.duration_s == 4 * 3600
    assert min(d.rates) == pytest.approx(4.5, rel=0.01) and max(d.rates) == pytest.approx(18.0, rel=0.01)
    assert d.rate(30 * 60) == pytest.approx(4.5, rel=0.01)  # 03:00 of the compressed day
    burst = traces.bursts()
    assert burst == traces.bursts() and len(burst.jumps) == 5
    assert max(burst.rates) == pytest.approx(20.0) and min(burst.rates) == pytest.approx(8.0)
    assert traces.steady().rates == (20.0,) * 7200


def test_provisioning_schedule_loads_early_and_keeps_short_gaps():
    ready = [2, 2, 3, 3, 2, 2, 2, 3, 2, 2, 2, 2, 2, 2]
    # The 3rd group is needed at minutes 2-3 and 7; the gap (3 min) is <= the load time (3 min):
    # it is kept; it loads from minute 0 (2 - 3 clipped: before the trace).
    assert provisioning_schedule(ready, 3) == [3, 3, 3, 3, 3, 3, 3, 3, 2, 2, 2, 2, 2, 2]
    assert provisioning_schedule([1, 1, 1, 1, 1, 1, 1, 2, 2, 1], 2) == [1, 1, 1, 1, 1, 2, 2, 2, 2, 1]


def test_hpa_follows_the_published_rule():
    hpa = HPAPolicy(target_s=0.005, min_replicas=1, max_replicas=20)
    obs = _obs(latency=0.0104)  # ratio 2.08 -> ceil(4 x 2.08) = 9, capped at max(+100%, +4) = 8
    assert hpa.decide(0, obs, FleetState(current=4, ready=4)).desired == 8
    hold = HPAPolicy(target_s=0.005, min_replicas=1, max_replicas=20)
    assert hold.decide(0, _obs(latency=0.0053), FleetState(current=4, ready=4)).desired == 4  # inside 10%
    down = HPAPolicy(target_s=0.005, min_replicas=1, max_replicas=20)
    assert down.decide(0, _obs(latency=0.0049), FleetState(current=4, ready=4)).desired == 4
    assert down.decide(30, _obs(latency=0.0025), FleetState(current=4, ready=4)).desired == 4  # window max
    assert down.decide(331, _obs(latency=0.0025), FleetState(current=4, ready=4)).desired == 2


def test_keda_follows_llm_ds_slo_control_law():
    """Saturation = P90 / SLO, clamped at 2 and averaged over 45 s; above theta_up the ask is
    credited by ready / provisioned; below theta_dn it sheds; the guide's HPA behavior shapes it."""
    keda = KEDASLOPolicy(slo_s=0.005, theta_dn=0.40, theta_up=0.55, min_replicas=1, max_replicas=20)
    four = FleetState(current=4, ready=4)
    assert keda.decide(0, _obs(latency=0.0025), four).desired == 4  # s = 0.5: inside the band
    # (0.5 + 1.1) / 2 = 0.8 -> 4 + ceil(4 (0.8 / 0.55 - 1)) = 6, held by the 30 s window's lowest (4).
    d = keda.decide(15, _obs(latency=0.0055), four)
    assert (d.recommendation, d.desired) == (6, 4)
    assert keda.decide(30, _obs(latency=0.0055), four).recommendation == 7  # (0.5 + 1.1 + 1.1) / 3 = 0.9
    d = keda.decide(45, _obs(latency=0.0055), four)  # t = 0 left the 45 s average: 1.1 -> 8
    assert (d.recommendation, d.desired) == (8, 6)  # the lowest of the last 30 s
    # Warming credit: 7 provisioned, 4 ready, s clamped at 2.0: 7 + ceil(7 (2 x 4/7 / 0.55 - 1)) = 15,
    # capped at max(+100 %, +4 pods) per 60 s: 14.
    warm = KEDASLOPolicy(slo_s=0.005, theta_dn=0.40, theta_up=0.55, min_replicas=1, max_replicas=20)
    d = warm.decide(0, _obs(latency=0.05), FleetState(current=7, ready=4, loading=3))
    assert (d.recommendation, d.desired) == (15, 14)
    # Below theta_dn, uncredited: 8 - floor(8 (1 - 0.2 / 0.4)) = 4, but 1 pod per 120 s.
    slow = KEDASLOPolicy(slo_s=0.005, theta_dn=0.40, theta_up=0.55, min_replicas=1, max_replicas=20)
    d = slow.decide(0, _obs(latency=0.001), FleetState(current=8, ready=8))
    assert (d.recommendation, d.desired) == (4, 7)
    assert slow.decide(15, _obs(latency=0.001), FleetState(current=7, ready=7)).desired == 7
    assert slow.decide(135, _obs(latency=0.001), FleetState(current=7, ready=7)).desired == 6


def test_dynamos_kalman_predictor_follows_a_trend():
    k = KalmanTrend()
    for i in range(4):
        k.observe(100.0 + 10 * i)
        assert k.next() == 100.0 + 10 * i  # until min_points: the last value
    for i in range(4, 30):
        k.observe(100.0 + 10 * i)
    assert k.next() == pytest.approx(100.0 + 10 * 30, abs=1.0)  # level + trend, one interval ahead
    c = ConstantNext()
    c.observe(5.0)
    assert c.next() == 5.0


def test_peers_choose_the_cheapest_setting_that_meets_the_slo():
    tried = [({"x": 1}, {"slo_attainment": 0.95, "gpu_hours": 10.0}),
             ({"x": 2}, {"slo_attainment": 0.995, "gpu_hours": 14.0}),
             ({"x": 3}, {"slo_attainment": 1.0, "gpu_hours": 12.0})]
    assert peers.choose(tried) == {"x": 3}
    assert peers.choose(tried[:1] + [({"x": 4}, {"slo_attainment": 0.97, "gpu_hours": 20.0})]) == {"x": 4}
    for name, setting in peers.CHOSEN.items():
        assert setting in peers.GRID[name]


def test_kpa_panics_at_twice_the_target():
    kpa = KPAPolicy(target=5.0, min_replicas=1, max_replicas=20)
    for t in range(0, 60, 2):
        kpa.frontend(GatewayReading(2, 0, 0, in_flight=10))
        kpa.decide(t, None, FleetState(current=2, ready=2))
    kpa.frontend(GatewayReading(2, 0, 0, in_flight=60))
    d = kpa.decide(60, None, FleetState(current=2, ready=2))
    assert d.reason == "KPAPanic" and d.desired == 4  # panic wants 12, rate-limited to 2 x 2 ready


def _obs(latency: float, running: float = 20, waiting: float = 0) -> DecodeObservation:
    from kimik3.autoscaler.histogram import INF, Histogram
    return DecodeObservation(at=0, window_s=30, itl=Histogram({latency * 0.999: 0, latency: 100, INF: 100}),
                             itl_metric="vllm:inter_token_latency_seconds", running=running, waiting=waiting,
                             generation_tokens=1000)


def test_benchmark_json_has_the_required_shape(setup, tmp_path):
    short = [traces.step(at_s=180, hold_s=180, duration_s=480), traces.steady(rate=6, duration_s=300)]
    cfg = replace(setup.cfg, load_time_s=60.0)
    s = replace(setup, cfg=cfg, model=GroupModel(cfg))
    runs = [benchmark.run_trace(s, t, seed=seed) for t in short for seed in (0, 1)]
    benchmark.write_json(runs, tmp_path / "autoscaler.json", {"seeds": [0, 1]})
    data = json.loads((tmp_path / "autoscaler.json").read_text())
    assert set(data) == {"run", "goal_misses", "traces"} and data["run"] == {"seeds": [0, 1]}
    assert set(data["traces"]) == {"step", "steady"}
    figures = {"slo_attainment", "gpu_hours", "gpu_hours_x_optimum", "scale_events", "recovery_s", "worst_p90_itl_s",
               "worst_p90_ttft_s"}
    for trace, by_policy in data["traces"].items():
        assert set(by_policy) == set(benchmark.POLICIES)
        for name, entry in by_policy.items():
            assert set(entry) == {"seeds", "min", "mean", "max"} and set(entry["seeds"]) == {"0", "1"}
            per_seed = list(entry["seeds"].values())
            for metrics in per_seed:
                assert set(metrics) == figures
                assert 0 <= metrics["slo_attainment"] <= 1 and metrics["gpu_hours"] > 0
                assert (metrics["recovery_s"] is None) == (trace == "steady")
            slo = [m["slo_attainment"] for m in per_seed]
            assert entry["min"]["slo_attainment"] == min(slo)
            assert entry["mean"]["slo_attainment"] == pytest.approx(sum(slo) / 2, abs=1e-6)
            assert entry["max"]["gpu_hours"] == max(m["gpu_hours"] for m in per_seed)
            if name == "optimal":
                assert {m["gpu_hours_x_optimum"] for m in per_seed} == {1.0}
    # The two seeds are different draws of the same trace.
    arrivals = {run.seed: [m.arrivals for m in run.results["optimal"].minutes]
                for run in runs if run.trace.name == "steady"}
    assert arrivals[0] != arrivals[1] and sum(arrivals[0]) == pytest.approx(6 * 300, rel=0.1)
    step = data["traces"]["step"]
    assert step["optimal"]["min"]["slo_attainment"] == 1.0
    assert step["static-peak"]["max"]["scale_events"] == 0 and step["static-peak"]["min"]["slo_attainment"] == 1.0
    assert "kimik3" in benchmark.table(runs, s.target_s)


def test_goal_misses_name_the_trace_seed_and_figures(setup):
    trace = traces.steady(rate=6, duration_s=300)

    def run(seed, ours, peer):
        summary = {"kimik3": ours, "hpa": peer, "optimal": {"slo_attainment": 1.0, "gpu_hours": 10.0}}
        for m in summary.values():
            m["gpu_hours_x_optimum"] = m["gpu_hours"] / 10.0
        return benchmark.TraceRun(trace, seed, [], {}, summary, 0.0)

    met = run(0, {"slo_attainment": 0.995, "gpu_hours": 10.5}, {"slo_attainment": 1.0, "gpu_hours": 11.0})
    assert benchmark.goal_misses([met]) == []
    missed = run(3, {"slo_attainment": 0.98, "gpu_hours": 11.5}, {"slo_attainment": 0.99, "gpu_hours": 11.0})
    assert benchmark.goal_misses([met, missed]) == [
        "steady seed 3: kimik3 missed the goal: SLO met in 98.0% of minutes, 1.0 points under the goal (>= 99%); GPU-hours 1.15x "
        "the optimum's, over the goal (<= 1.10x) by 0.05x",
        "steady seed 3: hpa beats kimik3 on both (99.0% at 11.0 GPU-h against 98.0% at 11.5)"]


def test_goals_hold_on_every_trace_recorded_ones_included(setup):
    """Issue 23 item 4: a trace the benchmark does not know by name (a recorded one) is checked
    like the synthetic ones, and the line says what was missed and what was met."""
    trace = traces.Trace("azure_conv", (1.0,) * 60)
    summary = {"kimik3": {"slo_attainment": 0.678, "gpu_hours": 9.6},
               "optimal": {"slo_attainment": 1.0, "gpu_hours": 10.0}}
    for m in summary.values():
        m["gpu_hours_x_optimum"] = m["gpu_hours"] / 10.0
    assert benchmark.goal_misses([benchmark.TraceRun(trace, 0, [], {}, summary, 0.0)]) == [
        "azure_conv seed 0: kimik3 missed the goal: SLO met in 67.8% of minutes, 31.2 points under the goal (>= 99%) "
        "(met: GPU-hours 0.96x)"]


def test_a_partial_rerun_keeps_the_other_policies_figures_per_trace_and_seed():
    """``--policy kimik3 --keep-others``: ours and the optimum re-run, every other policy's figures
    for the same trace and seed come from the previous results file, its ratio against the new
    optimum; the goals then compare every policy."""
    trace = traces.steady(rate=6, duration_s=300)
    summary = {"kimik3": {"slo_attainment": 0.98, "gpu_hours": 11.5, "gpu_hours_x_optimum": 1.15},
               "optimal": {"slo_attainment": 1.0, "gpu_hours": 10.0, "gpu_hours_x_optimum": 1.0}}
    run = benchmark.TraceRun(trace, 3, [], {}, summary, 0.0)
    previous = {"run": {"date": "2026-12-01T16:28:51Z", "commit": "1e0c515"},
                "traces": {"steady": {"hpa": {"seeds": {"3": {"slo_attainment": 0.99, "gpu_hours": 11.0,
                                                              "gpu_hours_x_optimum": 1.2}}},
                                      "kimik3": {"seeds": {"3": {"slo_attainment": 0.5, "gpu_hours": 1.0}}}}}}
    kept = benchmark.keep_others([run], previous)
    assert kept == {"hpa": [{"date": "2026-12-01T16:28:51Z", "commit": "1e0c515", "seeds": {"steady": [3]}}]}
    assert run.summary["hpa"] == {"slo_attainment": 0.99, "gpu_hours": 11.0, "gpu_hours_x_optimum": 1.1}
    assert run.summary["kimik3"]["gpu_hours"] == 11.5  # what ran is not overwritten
    assert benchmark.goal_misses([run])[-1] == \
        "steady seed 3: hpa beats kimik3 on both (99.0% at 11.0 GPU-h against 98.0% at 11.5)"
    # A second partial re-run names the run that computed the figures, not the one that kept them.
    again = benchmark.TraceRun(trace, 3, [], {}, {k: summary[k] for k in ("kimik3", "optimal")}, 0.0)
    kept_again = benchmark.keep_others([again], {"run": {"date": "2026-12-04T13:42:58Z", "commit": "cf39980", "kept": kept},
                                                 "traces": previous["traces"]})
    assert kept_again == kept


def test_a_rerun_of_some_traces_carries_the_others_over_with_their_provenance():
    """``--trace azure-code --keep-others``: a trace added to the benchmark runs alone; every other
    (trace, seed) of the previous file keeps every policy's figures, named by the run that computed
    them, so the file written, its table and its goals still cover every trace."""
    previous = {"run": {"date": "2026-12-05T07:52:32Z", "commit": "55cb2ab",
                        "kept": {"hpa": [{"date": "2026-12-05T05:23:18Z", "commit": "ed58ba0",
                                          "seeds": {"steady": [1]}}]}},
                "traces": {"steady": {
                    "kimik3": {"seeds": {"0": {"slo_attainment": 1.0, "gpu_hours": 11.0, "gpu_hours_x_optimum": 1.1},
                                         "1": {"slo_attainment": 0.98, "gpu_hours": 12.0, "gpu_hours_x_optimum": 1.2}}},
                    "hpa": {"seeds": {"1": {"slo_attainment": 0.99, "gpu_hours": 11.5, "gpu_hours_x_optimum": 1.15}}},
                    "optimal": {"seeds": {"0": {"slo_attainment": 1.0, "gpu_hours": 10.0, "gpu_hours_x_optimum": 1.0},
                                          "1": {"slo_attainment": 1.0, "gpu_hours": 10.0, "gpu_hours_x_optimum": 1.0}}}},
                    "azure-code": {"kimik3": {"seeds": {"0": {"slo_attainment": 0.5, "gpu_hours": 1.0}}}}}}
    carried, kept = benchmark.carried_over(previous, {("azure-code", 0), ("steady", 0)})
    assert [(r.trace.name, r.seed) for r in carried] == [("steady", 1)]
    assert carried[0].summary["hpa"] == {"slo_attainment": 0.99, "gpu_hours": 11.5, "gpu_hours_x_optimum": 1.15}
    assert kept == {"kimik3": [{"date": "2026-12-05T07:52:32Z", "commit": "55cb2ab", "seeds": {"steady": [1]}}],
                    "hpa": [{"date": "2026-12-05T05:23:18Z", "commit": "ed58ba0", "seeds": {"steady": [1]}}],
                    "optimal": [{"date": "2026-12-05T07:52:32Z", "commit": "55cb2ab", "seeds": {"steady": [1]}}]}
    assert benchmark.by_trace(carried)["steady"]["kimik3"]["seeds"] == {"1": previous["traces"]["steady"]["kimik3"]["seeds"]["1"]}
    assert benchmark.goal_misses(carried) == [
        "steady seed 1: kimik3 missed the goal: SLO met in 98.0% of minutes, 1.0 points under the goal (>= 99%); "
        "GPU-hours 1.20x the optimum's, over the goal (<= 1.10x) by 0.10x",
        "steady seed 1: hpa beats kimik3 on both (99.0% at 11.5 GPU-h against 98.0% at 12.0)"]
    assert benchmark.carried_over({}, set()) == ([], {})
    # A policy kept from two runs (hpa of steady seed 1 from ed58ba0, of a trace the previous run
    # computed itself from that run): each pair named by its own run, not the first one found
    previous["traces"]["azure-code"]["hpa"] = {"seeds": {"0": {"slo_attainment": 1.0, "gpu_hours": 2.0}}}
    _, mixed = benchmark.carried_over(previous, {("steady", 0)})
    assert mixed["hpa"] == [{"date": "2026-12-05T05:23:18Z", "commit": "ed58ba0", "seeds": {"steady": [1]}},
                            {"date": "2026-12-05T07:52:32Z", "commit": "55cb2ab", "seeds": {"azure-code": [0]}}]


def test_seeds_are_read_as_numbers_ranges_and_lists():
    assert benchmark.parse_seeds("0-4") == (0, 1, 2, 3, 4)
    assert benchmark.parse_seeds("3") == (3,)
    assert benchmark.parse_seeds("0,2-3,2") == (0, 2, 3)
    with pytest.raises(ValueError, match="'x' is not a seed or a range of seeds"):
        benchmark.parse_seeds("1,x")


def test_optimal_policy_plays_its_schedule():
    p = OptimalPolicy([2, 2, 5, 3])
    assert [p.decide(t, None, FleetState(2, 2)).desired for t in (0, 60, 120, 150, 180, 600)] == [2, 2, 5, 5, 3, 3]
