"""The weights gate (``kimik3.controller.staging``): no engine pod, no GPU, before the cache is staged.

Against a real kube-apiserver (no Job controller runs in this control plane, so the test plays
it: it writes the Job's ``Complete`` status as the controller would): a recipe with a cache
staged from the hub gets its claim, the stager ServiceAccount, one Job per artifact (target,
drafter) with a Role granting that one Job, and no LeaderWorkerSet; ``WeightsReady`` is False
``Staging`` with the bytes the stager reports (through its own ServiceAccount token, as the pod
does), and True ``Staged`` once both Jobs are complete, when the LeaderWorkerSet appears.
``weights_verdict`` is checked alone for the failure messages.
"""

from __future__ import annotations

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from kimik3.api.conditions import Reason
from kimik3.controller.reconcile import Reconciler
from kimik3.controller.staging import weights_verdict
from kimik3.engine.weights import Artifact
from kimik3.kube.kinds import JOB, KIMIK3_DEPLOYMENT, LEADER_WORKER_SET, PERSISTENT_VOLUME_CLAIM, ROLE
from kimik3.staging.progress import PROGRESS_ANNOTATION, Progress
from kimik3_dev.devcluster.rbac import request_token
from support.cluster import apply, condition
from support.recipes import recipe

CACHE = {"claimName": "kimi-k3-cache", "create": {"size": "4Ti", "storageClassName": "fast-rwx"},
         "hub": {"endpoint": "http://hub.mirror.svc:8080", "tokenSecret": {"name": "hf", "key": "token"}}}
TARGET, DRAFTER = Artifact("target", "moonshotai/Kimi-K3", "main"), Artifact("drafter", "Inferact/Kimi-K3-DSpark", "v2")


def staged_recipe(namespace: str) -> dict:
    cr = recipe(namespace=namespace, speculativeDecoding={"draftRevision": "v2"})
    cr["spec"]["model"]["source"] = {"cache": CACHE}
    return cr


def job(conditions: list[dict] | None = None, progress: Progress | None = None, failed: int = 0) -> dict:
    return {"metadata": {"annotations": {PROGRESS_ANNOTATION: progress.to_json()} if progress else {}},
            "status": {"conditions": conditions or [], "failed": failed}}


def test_staging_reports_bytes_files_and_eta():
    w = weights_verdict("c", [
        (TARGET, "j1", job(progress=Progress(TARGET.repo_id, "main", "downloading", "abc", 3 << 30, 4 << 30, 5, 9,
                                             eta_seconds=130))),
        (DRAFTER, "j2", None)])
    assert (w.ready, w.verdict.status, w.verdict.reason) == (False, "False", Reason.STAGING)
    assert w.verdict.message.startswith("staging into PVC c: 3.0 GiB of 4.0 GiB (75%), 5 of 9 files, ETA 2m10s; "
                                        "moonshotai/Kimi-K3@main downloading, Inferact/Kimi-K3-DSpark@v2 starting")


def test_a_failed_attempt_is_quoted_while_the_job_retries_and_after_it_gave_up():
    error = "RevisionNotFoundError: 404 Client Error. Revision Not Found for url ...: Invalid rev id: v2"
    report = Progress(DRAFTER.repo_id, "v2", "failed", error=error)
    retrying = weights_verdict("c", [(DRAFTER, "j2", job(progress=report, failed=2))])
    assert retrying.verdict.reason == Reason.STAGING_FAILED and not retrying.ready
    assert f"Job j2 staging Inferact/Kimi-K3-DSpark@v2: attempt 2 failed: {error}; the Job retries with back-off" \
        in retrying.verdict.message
    gave_up = weights_verdict("c", [(DRAFTER, "j2", job([{"type": "Failed", "status": "True", "reason":
                                                           "BackoffLimitExceeded", "message": "Job has reached the "
                                                           "specified backoff limit"}], report, failed=7))])
    assert ("Job j2 staging Inferact/Kimi-K3-DSpark@v2 failed (BackoffLimitExceeded: Job has reached the specified "
            f"backoff limit): {error}; fix the spec") in gave_up.verdict.message


def test_no_leaderworkerset_before_the_weights_then_engines(kube, namespace, admin_api, control_plane):
    cr = apply(kube, staged_recipe(namespace))
    rec = Reconciler(kube, compute_domains=False, stager_image="registry.example/kimik3-operator:1.0")
    rec.reconcile(namespace, cr["metadata"]["name"])
    assert kube.get(*LEADER_WORKER_SET.type_meta, namespace, "k3-latency-engine") is None
    pvc = kube.get(*PERSISTENT_VOLUME_CLAIM.type_meta, namespace, "kimi-k3-cache")
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"] and pvc["spec"]["storageClassName"] == "fast-rwx"
    assert pvc["spec"]["resources"]["requests"]["storage"] == "4Ti" and not pvc["metadata"].get("ownerReferences")
    jobs = kube.list(*JOB.type_meta, namespace, "inference.kimik3.io/stager=true")
    by_repo = {j["metadata"]["annotations"]["inference.kimik3.io/repo"]: j for j in jobs}
    assert set(by_repo) == {"moonshotai/Kimi-K3", "Inferact/Kimi-K3-DSpark"}
    drafter_job = by_repo["Inferact/Kimi-K3-DSpark"]
    name = drafter_job["metadata"]["name"]
    pod = drafter_job["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["image"] == "registry.example/kimik3-operator:1.0"
    assert container["args"] == ["stage", "--repo", "Inferact/Kimi-K3-DSpark", "--revision", "v2", "--to", "/cache",
                                 "--workers", "8", "--report-job", f"{namespace}/{name}"]
    assert {"name": "HF_ENDPOINT", "value": "http://hub.mirror.svc:8080"} in container["env"]
    assert {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}} in container["env"]
    assert pod["volumes"] == [{"name": "cache", "persistentVolumeClaim": {"claimName": "kimi-k3-cache"}}]
    assert pod["serviceAccountName"] == "kimik3-stager" and "nvidia.com/gpu" not in str(container["resources"])
    assert kube.get(*ROLE.type_meta, namespace, name)["rules"] == [
        {"apiGroups": ["batch"], "resources": ["jobs"], "resourceNames": [name], "verbs": ["get", "patch"]}]
    obj = kube.get(*KIMIK3_DEPLOYMENT.type_meta, namespace, "k3-latency")
    weights = condition(obj, "WeightsReady")
    assert (weights["status"], weights["reason"]) == ("False", "Staging")
    assert condition(obj, "Ready")["message"].startswith("waiting for the weights: staging into PVC kimi-k3-cache")

    # The stager reports as its pod does: with the kimik3-stager ServiceAccount's token, on its own Job only.
    token, _ = request_token(admin_api, namespace, "kimik3-stager")
    cfg = client.Configuration(host=control_plane.server)
    cfg.ssl_ca_cert, cfg.api_key = str(control_plane.ca_file), {"authorization": f"Bearer {token}"}
    with client.ApiClient(cfg) as stager_api:
        batch = client.BatchV1Api(stager_api)
        for repo, j in by_repo.items():
            done = Progress(repo, "x", "complete", "c0ffee" * 6 + "abcd", 2 << 30, 2 << 30, 9, 9, updated_at="2026-12-01T11:00:00Z")
            batch.patch_namespaced_job(j["metadata"]["name"], namespace,
                                       {"metadata": {"annotations": {PROGRESS_ANNOTATION: done.to_json()}}})
        for forbidden in (lambda: client.CoreV1Api(stager_api).list_namespaced_pod(namespace),
                          lambda: batch.list_namespaced_job(namespace)):  # its Jobs by name, nothing else
            with pytest.raises(ApiException) as refused:
                forbidden()
            assert refused.value.status == 403
    for j in by_repo.values():  # what the Job controller writes once its pod succeeded
        status = {"startTime": "2026-12-01T10:00:00Z", "completionTime": "2026-12-01T11:00:00Z", "succeeded": 1,
                  "conditions": [
                      {"type": "SuccessCriteriaMet", "status": "True", "lastTransitionTime": "2026-12-01T11:00:00Z",
                       "lastProbeTime": "2026-12-01T11:00:00Z"},
                      {"type": "Complete", "status": "True", "lastTransitionTime": "2026-12-01T11:00:00Z",
                       "lastProbeTime": "2026-12-01T11:00:00Z"}]}
        kube.patch_merge(*JOB.type_meta, namespace, j["metadata"]["name"], {"status": status}, subresource="status")
    announced = rec.reconcile(namespace, "k3-latency")  # WeightsReady=True is written before any engine
    assert kube.get(*LEADER_WORKER_SET.type_meta, namespace, "k3-latency-engine") is None
    assert announced.requeue_after == 0.0
    weights = condition(kube.get(*KIMIK3_DEPLOYMENT.type_meta, namespace, "k3-latency"), "WeightsReady")
    assert (weights["status"], weights["reason"]) == ("True", "Staged")
    rec.reconcile(namespace, "k3-latency")
    assert kube.get(*LEADER_WORKER_SET.type_meta, namespace, "k3-latency-engine") is not None
    weights = condition(kube.get(*KIMIK3_DEPLOYMENT.type_meta, namespace, "k3-latency"), "WeightsReady")
    assert (weights["status"], weights["reason"]) == ("True", "Staged")
    assert weights["message"] == ("staged in PVC kimi-k3-cache: moonshotai/Kimi-K3@main (commit c0ffeec0ffee, "
                                  "2.0 GiB, 9 files, verified at 2026-12-01T11:00:00Z) and Inferact/Kimi-K3-DSpark@v2 "
                                  "(commit c0ffeec0ffee, 2.0 GiB, 9 files, verified at 2026-12-01T11:00:00Z)")
