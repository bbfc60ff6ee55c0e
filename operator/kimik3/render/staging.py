"""What stages a model cache: its PersistentVolumeClaim, and one Job per hub repository and revision.

``staging_objects(admitted, namespace, image)`` returns, for a ``cache`` source with ``hub``:
the claim (when ``create`` is set), the ServiceAccount ``kimik3-stager``, and per artifact
(target, drafter) a Job ``kimik3-stage-<hash>`` with a Role and RoleBinding of the same name.
Choices:
- one Job per artifact, named by a hash of (claim, repository, revision, endpoint): deployments
  of a namespace that name the same claim and revision share one Job (a drafter is staged once
  for every target), and a new revision gets a new Job beside the one groups still load from;
- no owner reference: the Jobs, the claim and what it holds outlive any one deployment (a
  deleted and re-created deployment finds its ~1.5 TB staged); Jobs are the record of what was
  verified, and the operator never deletes a revision's folder;
- the Job runs the operator's own image (``kimik3 stage``: the core with huggingface_hub), on
  no GPU, ``backoffLimit`` ``BACKOFF_LIMIT``: the Job controller retries a failed pod with its
  exponential back-off (10 s, 20 s, 40 s, ... capped at 6 min);
- progress: the pod patches one annotation of its own Job (``kimik3.staging.progress``), granted
  by a Role on that one Job by name; the token Secret goes to the Job only, never to engines.
"""

from __future__ import annotations

import hashlib
from typing import Any

from kimik3.admission import Admitted
from kimik3.engine.weights import Artifact, cache_artifacts
from kimik3.kube.kinds import JOB, PERSISTENT_VOLUME_CLAIM, ROLE, ROLE_BINDING, SERVICE_ACCOUNT
from kimik3.kube.labels import MANAGED_BY, MANAGED_BY_LABEL, STAGER_LABEL

STAGER_SERVICE_ACCOUNT = "kimik3-stager"
CACHE_MOUNT = "/cache"
"""Where the stager mounts the claim (read-write)."""
BACKOFF_LIMIT = 6
"""Pod failures a staging Job retries before it fails."""
STAGER_WORKERS = 8
"""Parallel file downloads of one Job (huggingface_hub's default)."""
REPO_ANNOTATION = "inference.kimik3.io/repo"
REVISION_ANNOTATION = "inference.kimik3.io/revision"


def job_name(claim: str, artifact: Artifact, endpoint: str | None) -> str:
    """``kimik3-stage-<12 hex>``: the same for every deployment staging this artifact into this claim."""
    key = f"{claim}|{artifact.repo_id}|{artifact.revision}|{endpoint or ''}"
    return f"kimik3-stage-{hashlib.sha256(key.encode()).hexdigest()[:12]}"


def _meta(name: str, namespace: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "namespace": namespace, "labels": {MANAGED_BY_LABEL: MANAGED_BY}, **extra}


def claim(admitted: Admitted, namespace: str) -> dict[str, Any] | None:
    """The PersistentVolumeClaim to create, or None when the spec says it exists."""
    cache = admitted.spec.model.source.cache
    if cache is None or cache.create is None:
        return None
    spec: dict[str, Any] = {"accessModes": [cache.create.access_mode],
                            "resources": {"requests": {"storage": cache.create.size}}}
    if cache.create.storage_class_name:
        spec["storageClassName"] = cache.create.storage_class_name
    return {"apiVersion": PERSISTENT_VOLUME_CLAIM.api_version, "kind": PERSISTENT_VOLUME_CLAIM.kind,
            "metadata": _meta(cache.claim_name, namespace), "spec": spec}


def staging_jobs(admitted: Admitted, namespace: str, image: str) -> list[tuple[Artifact, list[dict[str, Any]]]]:
    """Per artifact to stage: its Job, Role and RoleBinding (empty unless the source is a cache
    staged from the hub)."""
    cache = admitted.spec.model.source.cache
    if cache is None or cache.hub is None:
        return []
    hub = cache.hub
    out: list[tuple[Artifact, list[dict[str, Any]]]] = []
    for artifact in cache_artifacts(admitted.spec):
        name = job_name(cache.claim_name, artifact, hub.endpoint)
        env: list[dict[str, Any]] = [{"name": "HF_HUB_DISABLE_TELEMETRY", "value": "1"}]
        if hub.endpoint:
            env.append({"name": "HF_ENDPOINT", "value": hub.endpoint})
        if hub.token_secret is not None:
            env.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": hub.token_secret.name,
                                                                           "key": hub.token_secret.key}}})
        labels = {MANAGED_BY_LABEL: MANAGED_BY, STAGER_LABEL: "true"}
        job: dict[str, Any] = {
            "apiVersion": JOB.api_version, "kind": JOB.kind,
            "metadata": _meta(name, namespace, labels=labels, annotations={
                REPO_ANNOTATION: artifact.repo_id, REVISION_ANNOTATION: artifact.revision}),
            "spec": {
                "backoffLimit": BACKOFF_LIMIT,
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "restartPolicy": "Never",
                        "serviceAccountName": STAGER_SERVICE_ACCOUNT,
                        # the operator image's non-root user; fsGroup makes the claim writable for it
                        "securityContext": {"runAsNonRoot": True, "runAsUser": 65532, "runAsGroup": 65532,
                                            "fsGroup": 65532, "seccompProfile": {"type": "RuntimeDefault"}},
                        "enableServiceLinks": False,
                        "containers": [{
                            "name": "stager", "image": image,
                            "args": ["stage", "--repo", artifact.repo_id, "--revision", artifact.revision,
                                     "--to", CACHE_MOUNT, "--workers", str(STAGER_WORKERS),
                                     "--report-job", f"{namespace}/{name}"],
                            "env": env,
                            "resources": {"requests": {"cpu": "2", "memory": "2Gi"}, "limits": {"memory": "8Gi"}},
                            "volumeMounts": [{"name": "cache", "mountPath": CACHE_MOUNT}],
                            "securityContext": {"allowPrivilegeEscalation": False, "privileged": False,
                                                "capabilities": {"drop": ["ALL"]}},
                        }],
                        "volumes": [{"name": "cache", "persistentVolumeClaim": {"claimName": cache.claim_name}}],
                    },
                },
            },
        }
        role: dict[str, Any] = {"apiVersion": ROLE.api_version, "kind": ROLE.kind, "metadata": _meta(name, namespace),
                "rules": [{"apiGroups": [JOB.group], "resources": [JOB.plural], "resourceNames": [name],
                           "verbs": ["get", "patch"]}]}
        binding: dict[str, Any] = {"apiVersion": ROLE_BINDING.api_version, "kind": ROLE_BINDING.kind, "metadata": _meta(name, namespace),
                   "roleRef": {"apiGroup": ROLE.group, "kind": ROLE.kind, "name": name},
                   "subjects": [{"kind": SERVICE_ACCOUNT.kind, "name": STAGER_SERVICE_ACCOUNT, "namespace": namespace}]}
        out.append((artifact, [role, binding, job]))
    return out


def service_account(namespace: str) -> dict[str, Any]:
    return {"apiVersion": SERVICE_ACCOUNT.api_version, "kind": SERVICE_ACCOUNT.kind,
            "metadata": _meta(STAGER_SERVICE_ACCOUNT, namespace)}
