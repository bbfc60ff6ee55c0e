"""The operator against a real kube-apiserver: recipes become accepted children, status tells
the truth, edits and drift converge, deletion keeps its order, bad specs are refused."""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kimik3.controller.kube import ApiError, Invalid, Kube
from kimik3.controller.reconcile import FINALIZER
from kimik3.render.meta import engine_set_name
from support.cluster import CD, CR, LWS, apply, condition, events, launcher_configmap, reconciled
from support.recipes import recipe
from support.rendering import launcher_name
from support.waiting import wait_for

KUBECTL = "kubectl"


def rank_args(kube: Kube, namespace: str, name: str) -> list[list[str]]:
    cm = launcher_configmap(kube, namespace, name)
    return [r["args"] for r in json.loads(cm["data"]["plan.json"])["ranks"]]


# ------------------------------------------------------------------------------------------------


def test_latency_recipe_becomes_owned_children_and_true_status(operator, kube, admin_api, namespace):
    created = apply(kube, recipe("gb300-tp8-megakernel-dspark.yaml"), namespace)
    obj = reconciled(kube, namespace, "k3-latency")
    uid = created["metadata"]["uid"]

    for (api_version, kind), name in [(CD, "k3-latency"), (("v1", "ConfigMap"), launcher_name(created)),
                                      (LWS, "k3-latency-engine"), (("v1", "Service"), "k3-latency"),
                                      (("monitoring.coreos.com/v1", "PodMonitor"), "k3-latency")]:
        child = kube.get(api_version, kind, namespace, name)
        assert child is not None, f"{kind} {name} missing"
        refs = child["metadata"]["ownerReferences"]
        assert refs == [{"apiVersion": "inference.kimik3.io/v1alpha1", "kind": "KimiK3Deployment",
                         "name": "k3-latency", "uid": uid, "controller": True, "blockOwnerDeletion": True}]
        managers = {m["manager"] for m in child["metadata"]["managedFields"]}
        assert managers == {"kimik3-operator"}
    # One group: a budget would block every drain (F3), so none exists.
    assert kube.get("policy/v1", "PodDisruptionBudget", namespace, "k3-latency") is None
    skipped = wait_for(lambda: events(admin_api, namespace, "DisruptionBudgetSkipped"), what="F3 warning")[0]
    assert skipped.type == "Warning" and "no group could ever be drained" in skipped.message

    lws = kube.get(*LWS, namespace, "k3-latency-engine")
    assert lws["spec"]["leaderWorkerTemplate"]["size"] == 2
    assert lws["metadata"]["annotations"]["leaderworkerset.sigs.k8s.io/exclusive-topology"] == "nvidia.com/gpu.clique"
    leader, worker = rank_args(kube, namespace, "k3-latency")
    assert leader[leader.index("--node-rank") + 1] == "0" and "--headless" not in leader
    assert worker[worker.index("--node-rank") + 1] == "1" and "--headless" in worker
    assert worker[worker.index("--master-addr") + 1] == "${LWS_LEADER_ADDRESS}"
    spec_cfg = json.loads(leader[leader.index("--speculative-config") + 1])
    assert spec_cfg == {"method": "dspark", "model": "/models/Inferact/Kimi-K3-DSpark/main", "num_speculative_tokens": 7,
                        "draft_sample_method": "probabilistic", "rejection_sample_method": "block"}

    status = obj["status"]
    assert status["endpoint"] == f"http://k3-latency.{namespace}.svc:8000/v1"
    assert status["plan"] == {"gpusPerNode": 4, "nodesPerGroup": 2, "gpusPerGroup": 8, "computeDomain": True}
    assert status["selector"] == ("inference.kimik3.io/deployment=k3-latency,"
                                  "leaderworkerset.sigs.k8s.io/worker-index=0")
    assert (status["replicas"], status["readyReplicas"]) == (0, 0)
    ready = condition(obj, "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "GroupsNotReady")
    assert condition(obj, "Degraded")["status"] == "False"
    assert obj["metadata"]["finalizers"] == [FINALIZER]
    assert [e.reason for e in events(admin_api, namespace, "Applied")] == ["Applied"]


def test_status_follows_the_leaderworkerset(operator, kube, namespace):
    apply(kube, recipe("gb300-dep16-throughput.yaml"), namespace)
    reconciled(kube, namespace, "k3-throughput")
    # What the LWS controller writes once the group's pods are ready.
    kube.patch_merge(*LWS, namespace, "k3-throughput-engine",
                     {"status": {"replicas": 1, "readyReplicas": 1}}, subresource="status")

    def ready() -> dict | None:
        obj = kube.get(*CR, namespace, "k3-throughput")
        return obj if condition(obj, "Ready")["status"] == "True" else None
    obj = wait_for(ready, what="Ready=True")
    assert condition(obj, "Ready")["reason"] == "AllGroupsReady"
    assert condition(obj, "Progressing")["status"] == "False"
    assert (obj["status"]["replicas"], obj["status"]["readyReplicas"]) == (1, 1)


def test_leader_waiting_is_named_in_status(operator, kube, admin_api, namespace):
    """F1: a leader stuck in ContainerCreating: the status says what the group waits for."""
    apply(kube, recipe("gb300-tp8-megakernel-dspark.yaml"), namespace)
    reconciled(kube, namespace, "k3-latency")
    core = client.CoreV1Api(admin_api)
    labels = {"leaderworkerset.sigs.k8s.io/name": "k3-latency-engine", "leaderworkerset.sigs.k8s.io/group-index": "0",
              "leaderworkerset.sigs.k8s.io/worker-index": "0", "app.kubernetes.io/managed-by": "kimik3-operator",
              "inference.kimik3.io/deployment": "k3-latency"}
    core.create_namespaced_pod(namespace, {"metadata": {"name": "k3-latency-engine-0", "labels": labels},
                                           "spec": {"containers": [{"name": "engine", "image": "x"}]}})
    core.patch_namespaced_pod_status("k3-latency-engine-0", namespace, {"status": {
        "phase": "Pending", "containerStatuses": [{"name": "engine", "image": "x", "imageID": "", "ready": False,
                                                   "restartCount": 0,
                                                   "state": {"waiting": {"reason": "ContainerCreating"}}}]}})

    def says_so() -> str | None:
        msg = condition(kube.get(*CR, namespace, "k3-latency"), "Ready")["message"]
        return msg if "ContainerCreating" in msg else None
    msg = wait_for(says_so, what="Ready message naming the waiting leader")
    assert "group 0: leader pod k3-latency-engine-0 is ContainerCreating" in msg
    assert "leader address up to 30m" in msg


def test_edited_spec_is_reconciled(operator, kube, namespace):
    apply(kube, recipe("gb300-tp8-megakernel-dspark.yaml"), namespace)
    reconciled(kube, namespace, "k3-latency")
    before = kube.get(*LWS, namespace, "k3-latency-engine")
    kube.patch_merge(*CR, namespace, "k3-latency", {"spec": {"engine": {"maxNumSeqs": 32}}})
    obj = reconciled(kube, namespace, "k3-latency", generation=2)
    assert obj["status"]["observedGeneration"] == 2
    for args in rank_args(kube, namespace, "k3-latency"):
        assert args[args.index("--max-num-seqs") + 1] == "32"
    # the new templates roll out through a new LeaderWorkerSet beside the old (controller.fleet)
    (after,) = wait_for(lambda: [o for o in kube.list(*LWS, namespace, "inference.kimik3.io/deployment=k3-latency")
                                 if o["metadata"]["name"] != "k3-latency-engine"] or None,
                        what="the new templates' LeaderWorkerSet")
    assert after["metadata"]["name"].startswith("k3-latency-engine-")
    assert kube.get(*LWS, namespace, "k3-latency-engine")["spec"] == before["spec"]  # the old one untouched
    key = "inference.kimik3.io/plan-hash"
    tmpl = "leaderTemplate"
    assert (before["spec"]["leaderWorkerTemplate"][tmpl]["metadata"]["annotations"][key]
            != after["spec"]["leaderWorkerTemplate"][tmpl]["metadata"]["annotations"][key]), "groups must roll"


def test_deleted_or_drifted_child_comes_back(operator, kube, namespace):
    apply(kube, recipe("gb300-tp8-megakernel-dspark.yaml"), namespace)
    reconciled(kube, namespace, "k3-latency")
    kube.delete("v1", "Service", namespace, "k3-latency")
    svc = wait_for(lambda: kube.get("v1", "Service", namespace, "k3-latency"), what="Service recreated")
    assert svc["spec"]["selector"]["leaderworkerset.sigs.k8s.io/worker-index"] == "0"
    # A second writer changes a field the operator owns: the operator takes it back.
    kube.patch_merge(*LWS, namespace, "k3-latency-engine", {"spec": {"leaderWorkerTemplate": {
        "restartPolicy": "None"}}})
    wait_for(lambda: kube.get(*LWS, namespace, "k3-latency-engine")["spec"]["leaderWorkerTemplate"]["restartPolicy"]
             == "RecreateGroupOnPodRestart", what="drift undone")


def test_kubectl_scale_drives_groups_and_budget(operator, kube, control_plane, namespace):
    apply(kube, recipe("gb300-tp8-megakernel-dspark.yaml"), namespace)
    reconciled(kube, namespace, "k3-latency")
    subprocess.run([KUBECTL, "--kubeconfig", str(control_plane.admin_kubeconfig), "-n", namespace, "scale",
                    "kimik3deployment/k3-latency", "--replicas=4"], check=True, capture_output=True)
    wait_for(lambda: kube.get(*LWS, namespace, "k3-latency-engine")["spec"]["replicas"] == 4, what="LWS at 4")
    pdb = wait_for(lambda: kube.get("policy/v1", "PodDisruptionBudget", namespace, "k3-latency"), what="PDB")
    # 75% of 4 groups must stay: D = 1 group may go. The budget counts pods but allows only D of
    # them unavailable (docs/reliability.md, F3): 4 groups x 2 pods - 1 = 7. At 6, two pods of two
    # different groups could go at once: two groups down.
    assert pdb["spec"]["minAvailable"] == 7
    scale = client.CustomObjectsApi(kube.api).get_namespaced_custom_object_scale(
        "inference.kimik3.io", "v1alpha1", namespace, "kimik3deployments", "k3-latency")
    assert scale["spec"]["replicas"] == 4
    assert scale["status"]["selector"].startswith("inference.kimik3.io/deployment=k3-latency,")


def test_scale_to_zero_releases_the_compute_domain(operator, kube, namespace):
    """F11 (replicas part): replicas 0 is accepted, LWS at 0, ComputeDomain released, Ready/ScaledToZero."""
    body = recipe("gb300-tp8-megakernel-dspark.yaml")
    apply(kube, body, namespace)
    reconciled(kube, namespace, "k3-latency")
    assert kube.get(*CD, namespace, "k3-latency") is not None
    kube.patch_merge(*CR, namespace, "k3-latency", {"spec": {"replicas": 0}})
    obj = reconciled(kube, namespace, "k3-latency", generation=2)
    assert kube.get(*LWS, namespace, "k3-latency-engine")["spec"]["replicas"] == 0
    assert kube.get(*CD, namespace, "k3-latency") is None
    ready = condition(obj, "Ready")
    assert (ready["status"], ready["reason"]) == ("True", "ScaledToZero")


def test_deletion_order_lws_then_pods_then_compute_domain(operator, kube, admin_api, namespace):
    """F4: the ComputeDomain goes only once no pod holds its claim; an Event names the blocking pod."""
    apply(kube, recipe("gb300-tp8-megakernel-dspark.yaml"), namespace)
    reconciled(kube, namespace, "k3-latency")
    core = client.CoreV1Api(admin_api)
    labels = {"leaderworkerset.sigs.k8s.io/name": "k3-latency-engine", "app.kubernetes.io/managed-by": "kimik3-operator",
              "inference.kimik3.io/deployment": "k3-latency"}
    core.create_namespaced_pod(namespace, {"metadata": {"name": "k3-latency-engine-0-1", "labels": labels,
                                                        "finalizers": ["test.kimik3.io/hold"]},
                                           "spec": {"containers": [{"name": "engine", "image": "x"}]}})
    kube.delete(*CR, namespace, "k3-latency")
    wait_for(lambda: kube.get(*LWS, namespace, "k3-latency-engine") is None, what="LWS deleted first")
    core.delete_namespaced_pod("k3-latency-engine-0-1", namespace)  # as garbage collection would; it terminates
    wait_for(lambda: events(admin_api, namespace, "TeardownWaiting"), what="TeardownWaiting event")
    assert "k3-latency-engine-0-1" in events(admin_api, namespace, "TeardownWaiting")[0].message
    time.sleep(2)
    assert kube.get(*CD, namespace, "k3-latency") is not None, "ComputeDomain must outlive the pods"
    assert kube.get(*CR, namespace, "k3-latency") is not None, "finalizer holds the CR during teardown"
    core.patch_namespaced_pod("k3-latency-engine-0-1", namespace, {"metadata": {"finalizers": None}})
    wait_for(lambda: kube.get(*CD, namespace, "k3-latency") is None, what="ComputeDomain deleted")
    wait_for(lambda: kube.get(*CR, namespace, "k3-latency") is None, what="CR gone")


def _spec_with(**changes: Any) -> dict[str, Any]:
    body = recipe("gb300-tp8-megakernel-dspark.yaml")
    body["metadata"]["name"] = f"bad-{uuid.uuid4().hex[:6]}"
    for path, value in changes.items():
        node = body["spec"]
        keys = path.split("__")
        for k in keys[:-1]:
            node = node.setdefault(k, {})
        node[keys[-1]] = value
    return body


INVALID = [
    # (what, spec changes, field path the API server names, words of the message)
    ("DP=6 on 4-GPU trays (F2)", dict(engine__decodeBackend="stock", speculativeDecoding={"method": "none"},
                                     topology={"accelerator": "gb300", "strategy": "dep", "dataParallelSize": 6}),
     "spec.topology.dataParallelSize", "multiple of the accelerator's GPUs per node"),
    ("dspark with pipeline parallelism (F7)", dict(engine__decodeBackend="stock",
                                                   topology={"strategy": "tp", "tensorParallelSize": 8,
                                                             "pipelineParallelSize": 2}),
     "spec.speculativeDecoding.method", "pipeline parallelism"),
    ("megakernel with expert parallelism", dict(speculativeDecoding={"method": "none"},
                                                topology={"strategy": "dep", "dataParallelSize": 16}),
     "spec.engine.decodeBackend", "megakernel"),
    ("megakernel with 8 DSpark tokens", dict(speculativeDecoding__numSpeculativeTokens=8),
     "spec.speculativeDecoding", "at most 7"),
    ("megakernel on H200", dict(topology={"accelerator": "h200", "tensorParallelSize": 16}),
     "spec.engine.decodeBackend", "SM100/SM103"),
    ("too little memory", dict(engine__decodeBackend="stock", topology={"accelerator": "gb200", "tensorParallelSize": 8}),
     "spec.topology", "too little memory"),
    ("two weight sources", dict(model__source={"pvc": {"claimName": "w"}, "hostPath": {"path": "/w"}}),
     "spec.model.source", "exactly one"),
    ("dspark without drafter", dict(speculativeDecoding={"method": "dspark", "numSpeculativeTokens": 7}),
     "spec.speculativeDecoding.draftModel", "draftModel"),
    ("min above max", dict(autoscaling={"enabled": True, "minReplicas": 3, "maxReplicas": 2,
                                        "metricsSource": {"prometheusUrl": "http://p:9090"}}),
     "spec.autoscaling.minReplicas", "minReplicas must be <= maxReplicas"),
    ("bad enum", dict(topology__accelerator="mi300"), "spec.topology.accelerator", "Unsupported value"),
    ("200 KB of inline engine configuration (F5)", dict(engine__extraArgs=["--x=" + "a" * 200_000]),
     "spec.engine.extraArgs[0]", "Too long"),
]


@pytest.mark.parametrize("what,changes,path,words", INVALID, ids=[i[0] for i in INVALID])
def test_api_server_refuses_invalid_specs_with_field_path(kube, namespace, what, changes, path, words):
    body = _spec_with(**changes)
    with pytest.raises(Invalid) as err:
        apply(kube, body, namespace)
    assert err.value.status == 422, err.value.body
    causes = json.loads(err.value.body)["details"]["causes"]
    assert any(c.get("field") == path and words in c["message"] for c in causes), causes


def test_unknown_field_is_refused_under_strict_validation(kube, namespace):
    body = _spec_with(engine__maxNumSeq=32)  # typo of maxNumSeqs
    body["metadata"]["namespace"] = namespace
    with pytest.raises(ApiException) as err:  # kubectl create / client-side apply
        client.CustomObjectsApi(kube.api).create_namespaced_custom_object(
            "inference.kimik3.io", "v1alpha1", namespace, "kimik3deployments", body, field_validation="Strict")
    assert err.value.status == 400, err.value.body
    assert 'unknown field "spec.engine.maxNumSeq"' in json.loads(err.value.body)["message"]
    with pytest.raises(ApiError) as err:  # server-side apply refuses it too, naming the field
        apply(kube, body, namespace)
    assert ".spec.engine.maxNumSeq: field not declared in schema" in err.value.body


def test_operator_refuses_what_the_schema_cannot_see(operator, kube, admin_api, namespace):
    """An operator-owned flag in extraArgs passes the schema; the operator refuses it, names the
    field, changes nothing and says so in status and an Event."""
    body = _spec_with(engine__extraArgs=["--tensor-parallel-size=4"])
    name = body["metadata"]["name"]
    apply(kube, body, namespace)
    obj = reconciled(kube, namespace, name)
    degraded = condition(obj, "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "InvalidSpec")
    assert "spec.engine.extraArgs[0]: --tensor-parallel-size is set by the operator" in degraded["message"]
    assert kube.get(*LWS, namespace, engine_set_name(name)) is None
    warning = wait_for(lambda: events(admin_api, namespace, "InvalidSpec"), what="InvalidSpec event")[0]
    assert warning.type == "Warning" and "spec.engine.extraArgs[0]" in warning.message


def test_kubectl_explain_shows_descriptions(control_plane):
    out = subprocess.run([KUBECTL, "--kubeconfig", str(control_plane.admin_kubeconfig), "explain",
                          "kimik3deployment.spec.speculativeDecoding"], check=True, capture_output=True, text=True)
    assert "Speculative decoding" in out.stdout
    assert "numSpeculativeTokens" in out.stdout and "megakernel decode path takes at most 7" in out.stdout


def test_operator_health_and_metrics(operator, kube, namespace):
    import urllib.request
    apply(kube, recipe("gb300-tp8-megakernel-dspark.yaml"), namespace)
    reconciled(kube, namespace, "k3-latency")
    assert urllib.request.urlopen(f"{operator.health_url}/healthz").status == 200
    assert urllib.request.urlopen(f"{operator.health_url}/readyz").status == 200
    text = urllib.request.urlopen(f"{operator.health_url}/metrics").read().decode()
    from prometheus_client.parser import text_string_to_metric_families
    families = {f.name: f for f in text_string_to_metric_families(text)}
    applied = {s.labels["kind"]: s.value for s in families["kimik3_children_applied"].samples
               if s.name.endswith("_total")}
    assert applied["LeaderWorkerSet"] >= 1 and applied["ComputeDomain"] >= 1
    results = {s.labels["result"] for s in families["kimik3_reconciles"].samples if s.name.endswith("_total")}
    assert "applied" in results
