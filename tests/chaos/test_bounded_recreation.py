"""Bounded recreation on the real API server: engine pods of one group fail (their status as the
kubelet writes it); at the 3rd failure in 10 min the CR turns Degraded=True GroupCrashLooping
with the last exit codes, and the launcher ConfigMap's plan gets the start back-off (10 s, then
20 s at the 4th). A container that ends because its pod is being deleted does not count."""

from __future__ import annotations

import json

from kubernetes import client

from kimik3.render.configmap import PLAN_KEY
from kimik3.render.meta import engine_set_name
from chaos.helpers import apply_converged, operator_in
from support.cluster import CR, condition, launcher_configmap
from support.waiting import wait_for

NAME = "k3-crash"
ENGINE = engine_set_name(NAME)


def failing_pod(core: client.CoreV1Api, namespace: str, index: int, code: int, reason: str,
                deleting: bool = False) -> None:
    name = f"{ENGINE}-0-{index}"
    core.create_namespaced_pod(namespace, {"metadata": {"name": name, "finalizers": ["kimik3.io/test"] if deleting else [],
                                                        "labels": {
        "leaderworkerset.sigs.k8s.io/name": ENGINE, "leaderworkerset.sigs.k8s.io/group-index": "0",
        "leaderworkerset.sigs.k8s.io/worker-index": "0", "app.kubernetes.io/managed-by": "kimik3-operator",
        "inference.kimik3.io/deployment": NAME}}, "spec": {"containers": [{"name": "engine", "image": "x"}]}})
    if deleting:
        core.delete_namespaced_pod(name, namespace)
    at = f"2026-12-01T10:00:{index:02d}Z"
    core.patch_namespaced_pod_status(name, namespace, {"status": {"containerStatuses": [{
        "name": "engine", "image": "x", "imageID": "", "ready": False, "restartCount": 0,
        "state": {"terminated": {"exitCode": code, "reason": reason, "startedAt": at, "finishedAt": at}}}]}})
    if deleting:
        core.patch_namespaced_pod(name, namespace, {"metadata": {"finalizers": None}})


def plan(kube, namespace: str) -> dict:
    return json.loads(launcher_configmap(kube, namespace, NAME)["data"][PLAN_KEY])


def test_group_failing_three_times_is_degraded_and_started_with_back_off(kube, admin_api, namespace,
                                                                         operator_identity):
    core = client.CoreV1Api(admin_api)
    with operator_in(operator_identity, namespace):
        apply_converged(kube, namespace, NAME)
        failing_pod(core, namespace, 1, 1, "Error")
        failing_pod(core, namespace, 2, 143, "Error", deleting=True)  # stopped by the group's deletion
        failing_pod(core, namespace, 3, 137, "OOMKilled")
        wait_for(lambda: len([e for e in core.list_namespaced_event(namespace).items
                              if e.reason == "EngineFailed"]) >= 2, 15, "the EngineFailed Events")
        assert condition(kube.get(*CR, namespace, NAME), "Degraded")["reason"] == "AsExpected"
        assert plan(kube, namespace)["startDelaySeconds"] == 0
        failing_pod(core, namespace, 4, 1, "Error")
        degraded = wait_for(lambda: (lambda c: c if c.get("reason") == "GroupCrashLooping" else None)(
            condition(kube.get(*CR, namespace, NAME), "Degraded")), 15, "Degraded=True GroupCrashLooping")
        assert degraded["status"] == "True"
        assert f"group(s) {ENGINE}/0 failed 3 times in the last 10 min (last" in degraded["message"]
        assert "last exit codes: 1 (Error), 137 (OOMKilled), 1 (Error)" in degraded["message"]
        wait_for(lambda: plan(kube, namespace)["startDelaySeconds"] == 10, 15, "a 10 s start back-off in the plan")
        failing_pod(core, namespace, 5, 1, "Error")
        wait_for(lambda: plan(kube, namespace)["startDelaySeconds"] == 20, 15, "the back-off doubled")
        assert any(e.reason == "GroupCrashLooping" for e in core.list_namespaced_event(namespace).items)
