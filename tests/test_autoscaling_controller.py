"""The autoscaler inside the reconcile, on a real kube-apiserver: decisions drive the
LeaderWorkerSet's replicas, and status, Events and conditions tell the story (F8, F10, F11).

A Reconciler is driven directly with a fake clock (no kopf here: decisions must be deterministic)
against its own control plane; group leaders are stand-in /metrics pages on 127.0.0.1.
"""

from __future__ import annotations

import re
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kubernetes import client
from prometheus_client import REGISTRY

from kimik3.render.revision import TEMPLATE_HASH_ANNOTATION as TEMPLATE_HASH
from kimik3 import admission
from kimik3.controller import reconcile, steps
from kimik3.controller.autoscaling import Autoscaling
from kimik3.controller.kube import Kube
from kimik3.controller.reconcile import Reconciler
from kimik3_dev.devcluster import prometheus
from kimik3_dev.devcluster.controlplane import ControlPlane
from kimik3_dev.devcluster.processes import free_port
from kimik3.kube.times import rfc3339
from test_autoscaler_metrics import exposition
from support.metrics_server import MetricsServer
from support.cluster import CD, CR, LWS, condition, events
from support.recipes import recipe
from support.reconciler import scraped_reconciler

ITL = "vllm:inter_token_latency_seconds"
GROUP_INDEX = "leaderworkerset.sigs.k8s.io/group-index"
REVISION = "leaderworkerset.sigs.k8s.io/template-revision-hash"

pytestmark = pytest.mark.tier("apiserver")  # a ControlPlane of its own (own_control_plane)


@pytest.fixture
def env(own_control_plane) -> Iterator[dict]:
    with scraped_reconciler(own_control_plane, "as") as e:
        yield e


def autoscaled_cr(ns: str, **autoscaling) -> dict:
    body = recipe(namespace=ns)
    body["spec"]["autoscaling"] = {"enabled": True, "minReplicas": 1, "maxReplicas": 4,
                                   "metricsSource": {"type": "podScrape"},
                                   "target": {"metric": "timePerOutputToken", "percentile": 90, "value": "5ms"},
                                   "interval": "30s", "window": "1m", "scaleDownStabilization": "2m",
                                   **autoscaling}
    return body


def running_leaders(e: dict, groups: int, ready: bool = True) -> None:
    """What the LWS controller and kubelet would report: leader pods Running, groups ready."""
    core = client.CoreV1Api(e["api"])
    for g in range(groups):
        name = f"k3-latency-engine-{g}"
        try:
            core.read_namespaced_pod(name, e["ns"])
            continue
        except client.ApiException:
            pass
        core.create_namespaced_pod(e["ns"], {"metadata": {"name": name, "labels": {
            "leaderworkerset.sigs.k8s.io/name": "k3-latency-engine", "leaderworkerset.sigs.k8s.io/group-index": str(g),
            "leaderworkerset.sigs.k8s.io/worker-index": "0", "app.kubernetes.io/managed-by": "kimik3-operator",
            "inference.kimik3.io/deployment": "k3-latency"}},
            "spec": {"containers": [{"name": "engine", "image": "x"}]}})
        core.patch_namespaced_pod_status(name, e["ns"], {"status": {"phase": "Running", "conditions": [
            {"type": "Ready", "status": "True" if ready else "False"}]}})
    e["kube"].patch_merge(*LWS, e["ns"], "k3-latency-engine",
                          {"status": {"replicas": groups, "readyReplicas": groups if ready else 0}}, subresource="status")


def tick(e: dict, seconds: float = 30) -> dict:
    e["clock"][0] += seconds
    e["rec"].reconcile(e["ns"], "k3-latency")
    return e["kube"].get(*CR, e["ns"], "k3-latency")


def serve(e: dict, steps: int, step_s: float, running: float, tokens: float, drafts: float = 0, accepted: float = 0,
          name: str = ITL) -> None:
    e["leader"].text = exposition(name, {0: [step_s] * steps}, running=running, drafts=drafts, accepted=accepted,
                                  tokens=tokens)


def started(e: dict, **autoscaling) -> dict:
    """The autoscaled CR applied and reconciled, group 0's leader serving and scraped once (no
    window yet); the CR after that first decision."""
    e["kube"].apply(autoscaled_cr(e["ns"], **autoscaling), force=False)
    e["rec"].reconcile(e["ns"], "k3-latency")
    running_leaders(e, 1)
    serve(e, 0, 0.01, running=0, tokens=0)
    return tick(e)


def test_load_step_scales_up_and_tells_the_story(env):
    e = env
    obj = started(e)
    assert condition(obj, "MetricsAvailable")["reason"] == "WarmingUp"
    assert obj["status"]["desiredReplicas"] == 1
    # A load step: 40 requests on one group, ~21 ms steps at 4.2 tokens/step (P90 5.6 ms per
    # token, over the 5 ms target), 30 s of 8000 output tokens/s.
    serve(e, 3000, 0.021, running=40, tokens=240_000, drafts=3000, accepted=9600)
    obj = tick(e)
    desired = obj["status"]["desiredReplicas"]
    assert desired >= 2, obj["status"]
    decode = obj["status"]["decode"]
    assert (decode["metric"], decode["percentile"]) == ("timePerOutputToken", 90)
    assert decode["latencySeconds"] == pytest.approx((0.01 + 0.015 * 0.9) / 4.2)  # P90 step / tokens per step
    assert e["kube"].get(*LWS, e["ns"], "k3-latency-engine")["spec"]["replicas"] == desired
    assert obj["status"]["lastScale"]["from"] == 1 and obj["status"]["lastScale"]["to"] == desired
    assert obj["status"]["lastScale"]["reason"].startswith("ScaleUp")
    assert obj["status"]["decode"]["acceptanceLength"] == pytest.approx(4.2)
    assert 150 < obj["status"]["decode"]["tokensPerSecondPerUser"] < 260
    assert condition(obj, "MetricsAvailable")["status"] == "True"
    scale_events = [ev for ev in events(e["api"], e["ns"]) if ev.reason.startswith("ScaleUp")]
    assert len(scale_events) == 1 and f"groups 1 -> {desired}" in scale_events[0].message


def test_no_latency_metric_holds_replicas_and_says_why(env):
    """F8: neither ITL name: replicas hold, MetricsAvailable=False names the reason."""
    e = env
    e["kube"].apply(autoscaled_cr(e["ns"], minReplicas=2), force=False)
    e["rec"].reconcile(e["ns"], "k3-latency")
    running_leaders(e, 2)
    e["leader"].text = "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine=\"0\"} 30\n"
    tick(e)
    obj = tick(e)
    cond = condition(obj, "MetricsAvailable")
    assert (cond["status"], cond["reason"]) == ("False", "NoLatencyMetric")
    assert "holding replicas at 2" in cond["message"]
    assert e["kube"].get(*LWS, e["ns"], "k3-latency-engine")["spec"]["replicas"] == 2
    assert obj["status"]["desiredReplicas"] == 2


def test_scale_to_zero_with_no_traffic_releases_the_compute_domain(env):
    """F11: minReplicas 0 and no traffic: LWS at 0, ComputeDomain released, Ready/ScaledToZero."""
    e = env
    obj = started(e, minReplicas=0, metricsSource={"type": "podScrape"})
    for _ in range(6):  # 3.5 minutes of silence > the 2-minute scale-down window
        obj = tick(e)
    assert obj["status"]["desiredReplicas"] == 0, obj["status"]
    assert e["kube"].get(*LWS, e["ns"], "k3-latency-engine")["spec"]["replicas"] == 0
    client.CoreV1Api(e["api"]).delete_collection_namespaced_pod(e["ns"])  # as the LWS controller would
    e["kube"].patch_merge(*LWS, e["ns"], "k3-latency-engine", {"status": {"replicas": 0, "readyReplicas": 0}},
                          subresource="status")
    obj = tick(e)
    assert e["kube"].get(*CD, e["ns"], "k3-latency") is None
    ready = condition(obj, "Ready")
    assert (ready["status"], ready["reason"]) == ("True", "ScaledToZero")
    assert condition(obj, "MetricsAvailable")["status"] == "True"


def test_no_further_scale_up_while_a_group_loads(env):
    """F10: a new group loading inside its load timeout counts as coming."""
    e = env
    started(e, maxReplicas=2)
    serve(e, 3000, 0.03, running=40, tokens=240_000, drafts=3000, accepted=9600)
    obj = tick(e)
    assert obj["status"]["desiredReplicas"] == 2
    # Group 1 exists but loads (created just now, not ready).
    core = client.CoreV1Api(e["api"])
    core.create_namespaced_pod(e["ns"], {"metadata": {"name": "k3-latency-engine-1", "labels": {
        "leaderworkerset.sigs.k8s.io/name": "k3-latency-engine", "leaderworkerset.sigs.k8s.io/group-index": "1",
        "leaderworkerset.sigs.k8s.io/worker-index": "0"}}, "spec": {"containers": [{"name": "engine", "image": "x"}]}})
    for i in range(4):
        serve(e, 3000 * (i + 2), 0.03, running=60, tokens=240_000 * (i + 2), drafts=3000 * (i + 2),
              accepted=9600 * (i + 2))
        obj = tick(e)
        assert obj["status"]["desiredReplicas"] == 2
    assert e["kube"].get(*LWS, e["ns"], "k3-latency-engine")["spec"]["replicas"] == 2


def test_decode_status_holds_the_target_metric_at_the_target_percentile(env):
    """status.decode says which latency it holds: with target interTokenLatency at P95 it is vLLM's
    raw ITL (per engine step) at P95, not the P90 per-token latency; tokens/s per user stays per
    token at that percentile; the operator's gauge carries the same labels. Between decisions the
    status keeps the last measurement."""
    e = env
    started(e, target={"metric": "interTokenLatency", "percentile": 95, "value": "30ms"})
    # 3000 engine steps of 21 ms (bucket 10-25 ms) at 4.2 tokens per step.
    serve(e, 3000, 0.021, running=8, tokens=240_000, drafts=3000, accepted=9600)
    obj = tick(e)
    decode = obj["status"]["decode"]
    p95_step = 0.01 + 0.015 * 0.95
    assert (decode["metric"], decode["percentile"]) == ("interTokenLatency", 95)
    assert decode["latencySeconds"] == pytest.approx(p95_step)
    assert decode["tokensPerSecondPerUser"] == pytest.approx(4.2 / p95_step)
    assert decode["acceptanceLength"] == pytest.approx(4.2)
    assert "p90ItlSeconds" not in decode
    gauge = REGISTRY.get_sample_value("kimik3_autoscaler_observed_latency_seconds", {
        "namespace": e["ns"], "deployment": "k3-latency", "metric": "interTokenLatency", "percentile": "95"})
    assert gauge == pytest.approx(p95_step)
    metrics_available = condition(obj, "MetricsAvailable")
    assert (metrics_available["status"], metrics_available["reason"]) == ("True", "Measured")
    later = tick(e, 5)  # before the next decision (interval 30 s): nothing measured, nothing changes
    assert later["status"]["decode"] == decode
    assert condition(later, "MetricsAvailable") == metrics_available


def test_each_window_with_traffic_says_whether_it_met_the_latency_and_ttft_targets(env):
    """kimik3_latency_within_target (the SLO minutes of docs/billing.md): 1 for a window within
    the per-token target, 0 for one above it; the ttft series only where a TTFT target is set,
    and none at all for a window without traffic."""
    e = env
    started(e, target={"metric": "interTokenLatency", "percentile": 90, "value": "30ms"})

    def within(target: str) -> float | None:
        return REGISTRY.get_sample_value("kimik3_latency_within_target", {
            "namespace": e["ns"], "deployment": "k3-latency", "target": target})
    serve(e, 3000, 0.021, running=8, tokens=3000)  # every step 10-25 ms: under 30 ms
    tick(e)
    assert (within("latency"), within("ttft")) == (1.0, None)
    serve(e, 6000, 0.04, running=8, tokens=6000)   # 3000 more steps of 25-50 ms: P90 above 30 ms
    tick(e)
    assert within("latency") == 0.0
    tick(e, 90)  # nothing served in the last window (1 min): no reading
    assert within("latency") is None


def test_one_reconcile_admits_once_and_hands_the_same_value_on(env, monkeypatch):
    """With autoscaling on, one reconcile parses and checks the spec once, derives the group plan
    once, and the autoscaler, the renderer and the status all take that one Admitted."""
    e = env
    started(e)  # the first decision only warms up
    serve(e, 3000, 0.021, running=40, tokens=240_000, drafts=3000, accepted=9600)
    calls: dict[str, list] = {"admit": [], "plan_group": [], "step": [], "render": [], "status": []}

    def counting(name: str, real):
        def call(*args, **kwargs):
            result = real(*args, **kwargs)
            calls[name].append((args, result))
            return result
        return call

    monkeypatch.setattr(reconcile, "admit", counting("admit", reconcile.admit))
    monkeypatch.setattr(admission, "plan_group", counting("plan_group", admission.plan_group))
    monkeypatch.setattr(steps, "render", counting("render", steps.render))
    monkeypatch.setattr(steps, "compute_status", counting("status", steps.compute_status))
    monkeypatch.setattr(e["rec"].autoscaling, "step", counting("step", e["rec"].autoscaling.step))
    obj = tick(e)
    assert obj["status"]["desiredReplicas"] >= 2  # this reconcile decided, and scaled up
    assert {k: len(v) for k, v in calls.items()} == {"admit": 1, "plan_group": 1, "step": 1, "render": 1,
                                                     "status": 1}
    (_, admitted), = calls["admit"]
    assert calls["step"][0][0][1] is admitted
    assert calls["render"][0][0][0] is admitted
    assert calls["status"][0][0][1] is admitted


class FourGroups:
    """4 groups serving 12 requests each at ~4.7 ms per token (target 5 ms), each leader its own
    /metrics page on 127.0.0.1, a Reconciler with a fake clock (or the real one, with a
    Prometheus source) on its own namespace. Each group's engine counts what it served since it
    started (``served``): a scrape that fails does not stop it, a restart sets it to zero."""

    def __init__(self, cp: ControlPlane, clock: list[float] | None = None):
        self.api = cp.api_client("admin")
        self.ns = f"as-{uuid.uuid4().hex[:8]}"
        client.CoreV1Api(self.api).create_namespace({"metadata": {"name": self.ns}})
        self.leaders = [MetricsServer() for _ in range(4)]
        self.clock = clock
        self.kube = Kube(self.api)
        self.rec = Reconciler(self.kube, autoscaling=Autoscaling(
            scrape_url=lambda pod, port: self.leaders[int(pod["metadata"]["labels"][GROUP_INDEX])].url,
            clock=(lambda: clock[0]) if clock is not None else time.time))
        self.served = [0.0] * 4
        self.e = {"kube": self.kube, "api": self.api, "ns": self.ns, "clock": clock, "rec": self.rec}

    def apply(self, serving: int = 4, **autoscaling: object) -> None:
        body = autoscaled_cr(self.ns, **autoscaling)
        body["spec"]["replicas"] = 4
        self.kube.apply(body, force=False)
        self.rec.reconcile(self.ns, "k3-latency")
        running_leaders(self.e, serving)

    def serve(self, seconds: float = 30.0, up: range = range(4)) -> None:
        """``seconds`` more of serving by the engines of ``up``: per 30 s and group 12 requests x
        30 s / 4.7 ms = 76,600 tokens; 71.5% of the steps under 10 ms, the rest at 20 ms (P90
        interpolates to 19.7 ms per step, 4.7 ms per token at 4.2 tokens per step)."""
        for g in up:
            self.served[g] += seconds / 30
            n = self.served[g]
            self.leaders[g].text = exposition(
                ITL, {0: [0.008] * round(715 * n) + [0.02] * round(285 * n)}, running=12, tokens=round(76_600 * n),
                drafts=round(18_238 * n), accepted=round(58_362 * n))

    def tick(self) -> dict:
        assert self.clock is not None
        self.serve()
        return tick(self.e)

    def replicas(self) -> int:
        return int(self.kube.get(*LWS, self.ns, "k3-latency-engine")["spec"]["replicas"])

    def close(self) -> None:
        for s in self.leaders:
            s.close()
        self.api.close()


@pytest.fixture
def four(own_control_plane) -> Iterator[FourGroups]:
    f = FourGroups(own_control_plane, clock=[1_000_000.0])
    yield f
    f.close()


def test_missing_groups_are_named_and_never_read_as_low_load(four):
    """3 of the 4 leaders stop answering (two with HTTP 503, one refusing connections). Through
    a scale-down window and more, replicas stay 4; MetricsAvailable names the missing groups and
    since when, and an Event says why the autoscaler holds. When they answer again the reading
    is whole once their counters cover a window again."""
    f = four
    f.apply()
    for _ in range(3):
        obj = f.tick()
    assert obj["status"]["desiredReplicas"] == 4, obj["status"]
    assert condition(obj, "MetricsAvailable")["message"].endswith("from 4 group(s)")
    assert obj["status"]["decode"]["latencySeconds"] == pytest.approx(0.0047, rel=0.01)
    f.leaders[1].status = f.leaders[2].status = 503
    f.leaders[3].close()
    lost_at = f.clock[0] + 30
    for _ in range(8):  # 4 minutes: twice the 2-minute scale-down window
        obj = f.tick()
        assert obj["status"]["desiredReplicas"] == 4, obj["status"]
        assert f.replicas() == 4
    cond = condition(obj, "MetricsAvailable")
    since = rfc3339(lost_at)
    assert (cond["status"], cond["reason"]) == ("True", "GroupsUnmeasured")
    assert cond["message"] == (f"{ITL} from 1 of 4 serving group(s); no metrics from group(s) 1 (since {since}), "
                               f"2 (since {since}), 3 (since {since}): never scaling down on this reading")
    held = events(f.api, f.ns, "MetricsIncomplete")
    assert held and "group(s) 1, 2, 3 of 4 serving gave no metrics" in held[0].message
    f.leaders[1].status = f.leaders[2].status = 200
    f.leaders[3] = MetricsServer()
    obj = f.tick()
    assert condition(obj, "MetricsAvailable")["message"].endswith(
        "the counters of group(s) 1, 2, 3 do not cover the window (a first sample, back after a gap, or reset): "
        "never scaling down on this reading")
    for _ in range(2):
        obj = f.tick()
    assert condition(obj, "MetricsAvailable")["reason"] == "Measured"


def test_a_gap_a_join_and_a_restart_at_steady_load_never_scale_down(four):
    """Issue 23 item 5 with the pod-scrape source, 4 groups at a steady load the 4 of them serve
    (1-minute window, 2-minute scale-down window, a decision every 30 s):

    - group 3 joins: its leader's first page (nothing scraped before: no known zero) counts its
      gauges, not its counters, for a window;
    - groups 2 and 3's scrapes fail for 150 s while their engines serve, then come back (their
      pages starting the window are 3 minutes old);
    - group 1's engine restarts between two scrapes (its counters go back to zero).

    Through each, and a scale-down window after, the deployment stays at 4 groups; the readings
    with a group's counters short are named in MetricsAvailable."""
    f = four
    f.apply(serving=3)
    f.serve(30, range(3))
    f.rec.reconcile(f.ns, "k3-latency")
    reasons = []
    for _ in range(3):
        obj = f.tick()
    running_leaders(f.e, 4)  # group 3 joins
    for _ in range(6):
        obj = f.tick()
        reasons.append(condition(obj, "MetricsAvailable")["reason"])
        assert (obj["status"]["desiredReplicas"], f.replicas()) == (4, 4), obj["status"]
    assert reasons[:2] == ["GroupsUnmeasured"] * 2 and reasons[-1] == "Measured"
    f.leaders[2].status = f.leaders[3].status = 503
    for _ in range(5):  # 150 s
        obj = f.tick()
        assert (obj["status"]["desiredReplicas"], f.replicas()) == (4, 4), obj["status"]
    f.leaders[2].status = f.leaders[3].status = 200
    reasons = []
    for _ in range(6):
        obj = f.tick()
        reasons.append(condition(obj, "MetricsAvailable")["reason"])
        assert (obj["status"]["desiredReplicas"], f.replicas()) == (4, 4), obj["status"]
    assert reasons[0] == "GroupsUnmeasured" and reasons[-1] == "Measured"
    f.served[1] = 0.0  # group 1's engine restarts
    reasons = []
    for _ in range(6):
        obj = f.tick()
        reasons.append(condition(obj, "MetricsAvailable")["message"])
        assert (obj["status"]["desiredReplicas"], f.replicas()) == (4, 4), obj["status"]
    assert "the counters of group(s) 1 do not cover the window" in reasons[0]
    assert reasons[-1] == f"{ITL} from 4 group(s)"
    assert obj["status"]["decode"]["latencySeconds"] == pytest.approx(0.0047, rel=0.01)


def test_mid_rollout_a_ready_surge_group_is_loading_and_a_lower_maximum_takes_effect(env):
    """Issue 12 item 6: two groups on the old LeaderWorkerSet and a Ready group of the new one
    (``controller.fleet``), which the operator sizes to 2 while the old one gives up a group. The
    autoscaler counts 2 groups serving and the new set's second group as loading (the load over
    target adds no group while it loads), and maxReplicas lowered mid-rollout takes effect at the
    next decision."""
    e = env
    started(e, maxReplicas=2)
    serve(e, 3000, 0.03, running=40, tokens=240_000, drafts=3000, accepted=9600)
    assert tick(e)["status"]["desiredReplicas"] == 2
    running_leaders(e, 2)
    core = client.CoreV1Api(e["api"])
    for g in range(2):
        core.patch_namespaced_pod(f"k3-latency-engine-{g}", e["ns"], {"metadata": {"labels": {REVISION: "old"}}})
    old = e["kube"].get(*LWS, e["ns"], "k3-latency-engine")
    rendered = old["metadata"]["annotations"][TEMPLATE_HASH]
    new = f"k3-latency-engine-{rendered[:8]}"
    e["kube"].patch_merge(*LWS, e["ns"], "k3-latency-engine", {"metadata": {"annotations": {TEMPLATE_HASH: "old"}}})
    e["kube"].apply({"apiVersion": old["apiVersion"], "kind": old["kind"], "metadata": {
        "name": new, "namespace": e["ns"], "labels": old["metadata"]["labels"],
        "annotations": {TEMPLATE_HASH: rendered, "inference.kimik3.io/replicas": "2"},
        "ownerReferences": old["metadata"]["ownerReferences"]},
        "spec": {**old["spec"], "replicas": 1}})
    core.create_namespaced_pod(e["ns"], {"metadata": {"name": f"{new}-0", "labels": {
        "leaderworkerset.sigs.k8s.io/name": new, GROUP_INDEX: "0", REVISION: "new",
        "leaderworkerset.sigs.k8s.io/worker-index": "0", "app.kubernetes.io/managed-by": "kimik3-operator",
        "inference.kimik3.io/deployment": "k3-latency"}},
        "spec": {"containers": [{"name": "engine", "image": "x"}]}})
    core.patch_namespaced_pod_status(f"{new}-0", e["ns"], {"status": {"phase": "Running", "conditions": [
        {"type": "Ready", "status": "True"}]}})
    for i in range(3):
        serve(e, 3000 * (i + 2), 0.03, running=60, tokens=240_000 * (i + 2), drafts=3000 * (i + 2),
              accepted=9600 * (i + 2))
        obj = tick(e)
        assert obj["status"]["desiredReplicas"] == 2, obj["status"]
    assert condition(obj, "Progressing")["reason"] == "RolloutInProgress"
    assert REGISTRY.get_sample_value("kimik3_autoscaler_ready_groups",
                                     {"namespace": e["ns"], "deployment": "k3-latency"}) == 2
    loading = events(e["api"], e["ns"], "GroupsLoading")
    assert loading and loading[0].message.startswith("holding 2 group(s): 1 group(s) still loading count as coming")
    obj = e["kube"].patch_merge(*CR, e["ns"], "k3-latency", {"spec": {"autoscaling": {"maxReplicas": 1}}})
    serve(e, 3000 * 5, 0.03, running=60, tokens=240_000 * 5, drafts=3000 * 5, accepted=9600 * 5)
    obj = tick(e)
    assert obj["status"]["desiredReplicas"] == 1
    assert e["kube"].get(*LWS, e["ns"], new)["spec"]["replicas"] == 1
    assert obj["status"]["lastScale"]["reason"].startswith("ReplicaBounds: spec.autoscaling.maxReplicas is 1")



class ScrapedByPrometheus:
    """``FourGroups`` on the real clock, read through a real Prometheus (2.42, 1 s scrapes of the
    four stand-in leaders as static targets with the PodMonitor's labels) by the operator's
    Prometheus source. Each engine serves in real time at ``FourGroups.serve``'s rates: a thread
    renders every page (every 0.2 s) from the seconds since ``zero[g]``, its engine's start (a
    restart sets it to now); a leader's ``status`` 503 is a failed scrape (or an engine not up)."""

    def __init__(self, cp: ControlPlane, tmp_path: Path):
        self.f = FourGroups(cp)
        self.zero = [time.time()] * 4
        self._stop = threading.Event()
        threading.Thread(target=self._render, daemon=True).start()
        config = prometheus.write_config(tmp_path, [
            (s.url.split("/")[2], {"namespace": self.f.ns, "deployment": "k3-latency", "group": str(g),
                                   "role": "leader"}) for g, s in enumerate(self.f.leaders)], interval="1s")
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.proc = subprocess.Popen(prometheus.argv(prometheus.ensure_installed(), config, tmp_path, port),
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.seen: list[tuple[float, int, int, str]] = []
        """(unix seconds, desiredReplicas, LWS spec.replicas, MetricsAvailable message) per reconcile."""

    def _render(self) -> None:
        while not self._stop.is_set():
            now = time.time()
            for g in range(4):
                self.f.served[g] = (now - self.zero[g]) / 30
            self.f.serve(0)
            self._stop.wait(0.2)

    def until(self, wanted: Callable[[str], bool], timeout: float, what: str) -> str:
        """Reconcile every second (the CR's interval) until the MetricsAvailable message is
        ``wanted``, asserting at each that the deployment keeps 4 groups; that message."""
        deadline = time.monotonic() + timeout
        while True:
            self.f.rec.reconcile(self.f.ns, "k3-latency")
            obj = self.f.kube.get(*CR, self.f.ns, "k3-latency")
            message = condition(obj, "MetricsAvailable").get("message", "")
            self.seen.append((time.time(), obj["status"].get("desiredReplicas"), self.f.replicas(), message))
            assert self.seen[-1][1:3] == (4, 4), self.seen[-6:]
            if wanted(message):
                return message
            assert time.monotonic() < deadline, f"{what}: not within {timeout} s; last readings {self.seen[-4:]}"
            time.sleep(1.0)

    def close(self) -> None:
        self._stop.set()
        self.proc.terminate()
        self.proc.wait(10)
        self.f.close()


@pytest.fixture
def scraped(own_control_plane, tmp_path) -> Iterator[ScrapedByPrometheus]:
    p = ScrapedByPrometheus(own_control_plane, tmp_path)
    yield p
    p.close()


@pytest.mark.timeout(120)
def test_through_prometheus_a_join_a_gap_and_a_restart_at_steady_load_never_scale_down(scraped):
    """Issue 23 item 5 with the Prometheus source: the pod-scrape test above on the real clock, 4
    groups at a steady load the 4 of them serve (6 s window, 10 s scale-down window, a decision
    every second, 1 s scrapes):

    - group 3 joins: its engine starts (its page answered 503 before: no series) as its group
      becomes ready; Prometheus has no sample of its counter at the window's start;
    - groups 2 and 3's scrapes fail for 8 s (Prometheus marks their series stale) while their
      engines serve, then come back;
    - group 1's engine restarts (its counters go back to zero: ``resets()`` finds it).

    Through each the deployment keeps 4 groups (checked at every reconcile); MetricsAvailable names
    the groups missing or short, and where a partial reading's load read low the decision says
    why it did not scale down (MetricsIncomplete); whole again within a window."""
    p, f = scraped, scraped.f
    f.leaders[3].status = 503  # group 3's engine is not up yet
    f.apply(serving=3, metricsSource={"type": "prometheus", "prometheusUrl": p.url},
            interval="1s", window="6s", scaleDownStabilization="10s")
    whole = f"{ITL} from %d group(s)"
    p.until(lambda m: m == whole % 3, 30, "a whole reading of the 3 serving groups")
    # Group 3 joins: its engine starts as its leader becomes ready.
    p.zero[3] = time.time()
    f.leaders[3].status = 200
    running_leaders(f.e, 4)
    short = p.until(lambda m: "do not cover" in m, 10, "group 3's counters short")
    assert short.endswith("the counters of group(s) 3 do not cover the window (a first sample, back after a gap, "
                          "or reset): never scaling down on this reading"), short
    p.until(lambda m: m == whole % 4, 15, "group 3 covering the window")
    # Groups 2 and 3's scrapes fail for 8 s, then come back.
    f.leaders[2].status = f.leaders[3].status = 503
    gone = p.until(lambda m: "no metrics from group(s) 2" in m, 10, "groups 2 and 3 missing")
    assert gone.startswith(f"{ITL} from 2 of 4 serving group(s); no metrics from group(s) 2 (since "), gone
    time.sleep(8)
    f.leaders[2].status = f.leaders[3].status = 200
    back = p.until(lambda m: "do not cover" in m, 10, "groups 2 and 3 back, short")
    assert "the counters of group(s) 2, 3 do not cover the window" in back, back
    p.until(lambda m: m == whole % 4, 15, "groups 2 and 3 covering the window")
    # Group 1's engine restarts.
    p.zero[1] = time.time()
    reset = p.until(lambda m: "do not cover" in m, 10, "group 1's reset seen")
    assert "the counters of group(s) 1 do not cover the window" in reset, reset
    p.until(lambda m: m == whole % 4, 15, "the reset out of the window")
    obj = f.kube.get(*CR, f.ns, "k3-latency")
    assert obj["status"]["decode"]["latencySeconds"] == pytest.approx(0.0047, rel=0.05)
    assert not events(f.api, f.ns, "ScaleDown")
    held = " / ".join(e.message for e in events(f.api, f.ns, "MetricsIncomplete"))
    assert "group(s) 2, 3 of 4 serving gave no metrics" in held, held
    # A hold on counters that do not cover the window says so too: which one (the first readings of
    # the 3 groups, or groups 2 and 3 back from the gap) depends on when a reading asked for fewer
    # groups than serve (a full CI run on a slow machine held on the first, 2026-12-05).
    assert re.search(r"the counters of group\(s\) [0-9, ]+ of [34] serving do not cover", held), held
