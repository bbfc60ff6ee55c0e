"""How far ahead the policy looks before it has timed a scale-up of its own (issue 16): the load
time the cluster reports for the serving groups (``FleetState.load_time_s``), as the controller
reads it from the pods and as the kit's fleet simulator reports it for the groups it starts with."""

from __future__ import annotations

import pytest

from kimik3.autoscaler.policy import FleetState
from kimik3.controller.autoscaling import fleet_state, load_seconds
from kimik3.kube.groups import groups_of
from kimik3.controller.fleet import engine_sets
from kimik3_dev.benchmark import simulate as benchmark
from kimik3_dev.benchmark.fleet import FleetSim
from kimik3.kube.times import rfc3339
from tests.test_autoscaler_policy import obs, policy
from tests.test_fleet_sim import RECIPE, Scripted

LWS = "leaderworkerset.sigs.k8s.io"
T0 = 1_796_083_200.0  # 2026-12-01T00:00:00Z


def _ts(offset_s: float) -> str:
    return rfc3339(T0 + offset_s)


def pod(group: int, worker: int, created: float, ready: float | None) -> dict:
    """A LeaderWorkerSet v0.9 pod created ``created`` s after T0, Ready since ``ready`` (None: not Ready)."""
    cond = {"type": "Ready", "status": "False"} if ready is None else \
        {"type": "Ready", "status": "True", "lastTransitionTime": _ts(ready)}
    return {"metadata": {"name": f"k3-engine-{group}" + (f"-{worker}" if worker else ""),
                         "creationTimestamp": _ts(created),
                         "labels": {f"{LWS}/group-index": str(group), f"{LWS}/worker-index": str(worker),
                                    f"{LWS}/name": "k3-engine"}},
            "status": {"phase": "Running", "conditions": [cond]}}


def sets(replicas: int, pods: list[dict]) -> list:
    """The deployment's one LeaderWorkerSet ``k3-engine`` of ``replicas`` groups of 2 pods."""
    return engine_sets([{"metadata": {"name": "k3-engine", "uid": "u"}, "spec": {"replicas": replicas}}], groups_of(pods, 2))


def test_a_groups_load_runs_from_its_first_pods_creation_to_its_last_pods_ready():
    group = [pod(0, 0, 0, 895), pod(0, 1, 2, 905)]
    assert load_seconds(group, 5400) == 905.0
    assert load_seconds([pod(0, 0, 0, 7000)], 5400) is None  # past the startup probe's budget: not a load
    no_time = pod(0, 0, 0, 900)
    del no_time["status"]["conditions"][0]["lastTransitionTime"]
    assert load_seconds([no_time], 5400) is None


def test_the_cluster_reports_the_shortest_load_of_the_serving_groups():
    pods = [pod(0, 0, 0, 900), pod(0, 1, 0, 905),        # group 0: 905 s
            pod(1, 0, 3000, 3870), pod(1, 1, 3000, 3880),  # group 1: 880 s
            pod(2, 0, 0, 9000), pod(2, 1, 0, 900),        # group 2: a readiness flap hours later
            pod(3, 0, 9500, None), pod(3, 1, 9500, None)]  # group 3: still loading
    fleet = fleet_state(sets(4, pods), 4, groups_of(pods, 2), 5400, T0 + 10_000)
    assert (fleet.serving, fleet.loading, fleet.load_time_s) == (frozenset({"0", "1", "2"}), 1, 880.0)
    loading = [pod(0, 0, 9500, None)]
    assert fleet_state(sets(1, loading), 1, groups_of(loading, 2), 5400, T0 + 10_000).load_time_s is None


def _ramp(load_time_s: float | None) -> tuple[list[int], float]:
    """Decisions on a ramp of 1500 tok/s per minute from 8000 tok/s, the cluster reporting
    ``load_time_s``, and the demand forecast at the last one (210 s: 13250 tok/s, rising 25 tok/s
    per second)."""
    p = policy(lead_s=600, trend_window_s=240)
    fleet = FleetState(current=2, ready=2, serving=frozenset({"0"}), load_time_s=load_time_s)
    out = []
    for t in range(0, 240, 30):
        tok = 8_000 + 1500 * t / 60
        out.append(p.decide(t, obs(t, tok_s=tok, running=tok / 300, latency=0.004), fleet).desired)
    assert p.lead_s == max(600, load_time_s or 0) + 30
    return out, p.forecast.keep


def test_before_its_own_scale_up_the_policy_looks_the_clusters_load_time_ahead():
    unknown, at_900, at_300 = _ramp(None), _ramp(900.0), _ramp(300.0)
    assert unknown[1] == pytest.approx(13_250 + 25 * 630)  # lead_s + one interval ahead
    assert at_900[1] == pytest.approx(13_250 + 25 * 930)  # the load time + one interval ahead
    assert (unknown[0], at_900[0]) == ([2, 2, 2, 2, 4, 4, 4, 4], [2, 2, 2, 2, 5, 5, 5, 5])
    assert at_300 == unknown  # a shorter load never shortens the configured lead


def test_its_own_timed_scale_up_takes_over_from_the_clusters_figure():
    p = policy(lead_s=600)
    p.decide(0, obs(0, tok_s=30_000, running=60, latency=0.006), FleetState(current=1, ready=1, load_time_s=900.0))
    assert p.lead_s == 900 + 30
    for t in range(30, 1200, 30):
        p.decide(t, obs(t, tok_s=30_000, running=60, latency=0.006),
                 FleetState(current=4, ready=1, loading=3, load_time_s=900.0))
    p.decide(1200, obs(1200, tok_s=30_000, running=60, latency=0.004), FleetState(current=4, ready=4, load_time_s=900.0))
    assert p.lead_s == 1200 + 30  # its scale-up at 0 s served at 1200 s


def test_the_simulated_fleets_first_groups_report_the_load_time():
    s = benchmark.setup(RECIPE)
    seen = Scripted({})
    FleetSim(s.cfg, seen, [], 60, 3, model=s.model).run()
    assert [fleet.load_time_s for _, _, fleet in seen.seen] == [pytest.approx(900.0)] * 2
