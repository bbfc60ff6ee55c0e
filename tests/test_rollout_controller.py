"""Rollouts inside the reconcile, on a real kube-apiserver (issue 25): a canary whose metric
source cannot be read is never promoted and the CR says why; a release that never pulls is
rolled back at its progress deadline, its LeaderWorkerSet deleted, the CR quoting what it waited
on; a fix starts without the crash back-off its predecessor earned; with no room, an old group
that is not Ready gives its place.

A Reconciler is driven directly with a fake clock (the autoscaler's, which the rollouts share);
no LWS controller runs here, so the test makes each group's pods as LWS v0.9 would
(``support.lws_pods``), with the revision label and the readiness it needs.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes import client

from kimik3.controller.autoscaling import Autoscaling
from kimik3.controller.kube import Kube
from kimik3.controller.reconcile import Reconciler
from kimik3.kube.kinds import POD
from kimik3.kube.labels import LWS_REVISION_LABEL
from kimik3.kube.objects import is_deleting
from kimik3.render.configmap import PLAN_KEY, mounted
from kimik3.render.revision import TEMPLATE_HASH_ANNOTATION
from support.cluster import CR, LWS, apply, condition, events
from support.lws_pods import group_pods
from support.recipes import recipe

NAME, FIRST = "k3-latency", "k3-latency-engine"
UNREACHABLE = "http://127.0.0.1:9"  # the discard port: nothing answers


pytestmark = pytest.mark.usefixtures("pods_made")  # the groups' pods this module makes by hand

class Env:
    """A Reconciler on its own fake clock, in one namespace."""

    def __init__(self, kube: Kube, namespace: str):
        self.kube, self.ns, self.now = kube, namespace, 1_900_000_000.0
        self.rec = Reconciler(kube, autoscaling=Autoscaling(clock=lambda: self.now))

    def tick(self, seconds: float = 0.0) -> dict[str, Any]:
        self.now += seconds
        self.rec.reconcile(self.ns, NAME)
        cr = self.kube.get(*CR, self.ns, NAME)
        assert cr is not None
        return cr

    def group(self, lws_name: str, revision: str, ready: bool, waiting: str | None = None) -> None:
        """Group 0 of LeaderWorkerSet ``lws_name`` as its pods would be: running ``revision``,
        Ready or not (and the set's status counting it); ``waiting``: the engine container's waiting reason."""
        lws = self.kube.get(*LWS, self.ns, lws_name)
        assert lws is not None
        for pod in group_pods(lws, self.ns, 0):
            pod["metadata"]["labels"][LWS_REVISION_LABEL] = revision
            created = self.kube.apply({"apiVersion": "v1", "kind": "Pod", **pod})
            status: dict[str, Any] = {"phase": "Running" if waiting is None else "Pending",
                                      "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}
            if waiting is not None:
                status["containerStatuses"] = [{"name": c["name"], "image": c["image"], "imageID": "", "ready": False,
                                                "restartCount": 0, "state": {"waiting": {"reason": waiting}}}
                                               for c in pod["spec"]["containers"]]
            self.kube.patch_merge(*POD.type_meta, self.ns, created["metadata"]["name"], {"status": status},
                                  subresource="status")
        self.kube.patch_merge(*LWS, self.ns, lws_name, {"status": {"replicas": 1, "readyReplicas": int(ready)}},
                              subresource="status")

    def release(self, image: str) -> str:
        """Edit the CR to ``image``, reconcile; the name of the LeaderWorkerSet of the new templates."""
        self.kube.patch_merge(*CR, self.ns, NAME, {"spec": {"engine": {"image": image}}})
        self.tick()
        news = [s for s in self.kube.list(*LWS, self.ns, "") if s["metadata"]["name"] != FIRST]
        assert len(news) == 1, [s["metadata"]["name"] for s in news]
        return str(news[0]["metadata"]["name"])


def started(kube: Kube, namespace: str, **spec: Any) -> Env:
    """The recipe with ``spec`` applied and reconciled, its one group Ready on revision ``old``."""
    env = Env(kube, namespace)
    apply(kube, recipe(replicas=1, **spec), namespace)
    for _ in range(3):  # the finalizer, WeightsReady announced, then the engines
        env.tick()
    env.group(FIRST, "old", True)
    cr = env.tick()
    assert condition(cr, "Ready")["status"] == "True", cr["status"]
    return env


@pytest.mark.tier("apiserver")
def test_a_canary_is_never_promoted_while_its_metric_source_cannot_be_read(kube: Kube, namespace: str,
                                                                            admin_api: client.ApiClient) -> None:
    env = started(kube, namespace, autoscaling={"metricsSource": {"type": "prometheus", "prometheusUrl": UNREACHABLE}},
                  rollout={"canary": {"groups": 1, "bake": "60s", "analysis": {"interval": "10s", "minChecks": 2}}})
    canary = env.release("vllm/vllm-openai:v0.33.1")
    env.group(canary, "new", True)
    for _ in range(12):  # two minutes: twice the bake
        cr = env.tick(10)
        progressing = condition(cr, "Progressing")
        assert (progressing["status"], progressing["reason"]) == ("False", "MetricSourceUnreadable"), progressing
        assert kube.get(*LWS, namespace, FIRST)["spec"]["replicas"] == 1  # no old group replaced
    assert f"no reading of revision new from Prometheus at {UNREACHABLE} (PrometheusUnreachable" in progressing["message"]
    assert "0/2 passing check(s)" in progressing["message"]
    status = cr["status"]["rollout"]["canary"]
    assert not status.get("promoted") and status["checks"] == 0
    assert len(status["history"]) == 10 and {h["result"] for h in status["history"]} == {"SourceUnreadable"}
    assert events(admin_api, namespace, "MetricSourceUnreadable")
    assert not events(admin_api, namespace, "CanaryPromoted")


@pytest.mark.tier("apiserver")
def test_a_release_that_never_pulls_is_rolled_back_at_its_progress_deadline(kube: Kube, namespace: str,
                                                                           admin_api: client.ApiClient) -> None:
    env = started(kube, namespace, probes={"loadTimeout": "10m"}, rollout={"progressDeadline": "12m"})
    old_hash = kube.get(*LWS, namespace, FIRST)["metadata"]["annotations"][TEMPLATE_HASH_ANNOTATION]
    new = env.release("vllm/vllm-openai:v0.33.9")
    env.group(new, "new", False, waiting="ImagePullBackOff")
    cr = env.tick(1)
    assert condition(cr, "Progressing")["reason"] == "RolloutInProgress"
    assert cr["status"]["rollout"]["progress"]["readyGroups"] == 0
    cr = env.tick(12 * 60 - 2)
    assert condition(cr, "Progressing")["reason"] == "RolloutInProgress"
    cr = env.tick(2)
    progressing = condition(cr, "Progressing")
    assert (progressing["status"], progressing["reason"]) == ("False", "ProgressDeadlineExceeded"), progressing
    assert f"group 0: leader pod {new}-0 is ImagePullBackOff" in progressing["message"]
    assert "(rollout.progressDeadline 12m)" in progressing["message"]
    gone = kube.get(*LWS, namespace, new)
    assert gone is None or is_deleting(gone)
    assert kube.get(*LWS, namespace, FIRST)["metadata"]["annotations"][TEMPLATE_HASH_ANNOTATION] == old_hash
    assert cr["status"]["rollout"]["rolledBack"]["reason"] == "ProgressDeadlineExceeded"
    assert [e.type for e in events(admin_api, namespace, "ProgressDeadlineExceeded")] == ["Warning"]
    assert condition(env.tick(60), "Progressing")["reason"] == "ProgressDeadlineExceeded"  # the release stays refused


def launcher_delay(kube: Kube, namespace: str, lws_name: str) -> float:
    """``startDelaySeconds`` of the launcher ConfigMap the templates of LeaderWorkerSet ``lws_name`` mount."""
    lws = kube.get(*LWS, namespace, lws_name)
    assert lws is not None
    configmap = kube.get("v1", "ConfigMap", namespace, mounted(lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]) or "")
    assert configmap is not None
    return float(json.loads(configmap["data"][PLAN_KEY])["startDelaySeconds"])


@pytest.mark.tier("apiserver")
def test_a_fix_is_not_held_by_the_crash_back_off_of_the_release_it_replaces(kube: Kube, namespace: str) -> None:
    """Issue 25 item 4: a release that crash-loops earns a start back-off and Degraded; the fix
    (another image: the same launcher plan, the same ConfigMap) starts without the back-off, and
    Degraded clears once the release's LeaderWorkerSet is gone and every group is Ready."""
    env = started(kube, namespace)
    bad = env.release("vllm/vllm-openai:v0.33.8")
    env.group(bad, "bad", False)
    for i in range(4):  # what the pod watch would have recorded (controller.crashes)
        env.rec.failures.record(namespace, NAME, f"bad-{i}", bad, "0", 1, "Error")
    cr = env.tick(10)
    assert (condition(cr, "Degraded")["status"], condition(cr, "Degraded")["reason"]) == ("True", "GroupCrashLooping")
    assert f"group(s) {bad}/0 failed 4 times" in condition(cr, "Degraded")["message"]
    assert launcher_delay(kube, namespace, bad) == 20  # 10 s at the 3rd failure, doubled at the 4th
    fix = env.release("vllm/vllm-openai:v0.33.9")
    assert fix != bad and launcher_delay(kube, namespace, fix) == 0  # the same ConfigMap, now without back-off
    gone = kube.get(*LWS, namespace, bad)
    assert gone is None or is_deleting(gone)  # its group never served: it goes at once
    env.group(fix, "fix", True)
    cr = env.tick(10)
    assert condition(cr, "Degraded")["reason"] == "AsExpected", condition(cr, "Degraded")
    assert condition(cr, "Ready")["status"] == "True"


@pytest.mark.tier("apiserver")
def test_on_a_full_cluster_an_old_group_that_is_not_ready_gives_its_place(kube: Kube, namespace: str) -> None:
    """Issue 25 item 4: no rack for the new group (its pods Unschedulable) and the old group not
    Ready: the old group is taken down (it served nothing) for the new one to be placed."""
    env = started(kube, namespace)
    env.group(FIRST, "old", False)
    new = env.release("vllm/vllm-openai:v0.33.9")
    lws = kube.get(*LWS, namespace, new)
    for pod in group_pods(lws, namespace, 0):
        created = kube.apply({"apiVersion": "v1", "kind": "Pod", **pod})
        kube.patch_merge(*POD.type_meta, namespace, created["metadata"]["name"], {"status": {"phase": "Pending",
                         "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                         "message": "0/4 nodes are available: 4 Insufficient nvidia.com/gpu."}]}},
                         subresource="status")
    cr = env.tick(10)
    old = kube.get(*LWS, namespace, FIRST)
    assert old is None or is_deleting(old), old["spec"]
    assert kube.get(*LWS, namespace, new)["spec"]["replicas"] == 1
    assert condition(cr, "Progressing")["reason"] in ("SurgeBlocked", "RolloutInProgress", "GroupsStarting")
