"""The LeaderWorkerSet: one group of ``nodes_per_group`` pods per replica.

Leader and worker pods run the same launcher; they differ in probes and ports. Choices and their
sources (gb300-on-kubernetes.md, failure-cases.md):
- ``restartPolicy: RecreateGroupOnPodRestart``: a multi-node engine cannot lose one rank, so a
  failed pod recreates its whole group and only that group (F14);
- ``startupPolicy: LeaderCreated``: with LeaderReady a TP group deadlocks (its leader is Ready
  only once the workers joined); workers instead wait for the leader's address (F1);
- placement ``exclusive``: the ``exclusive-topology`` annotation on ``nvidia.com/gpu.clique`` puts
  each group alone in one NVL72 rack; placement ``kueue``: the queue (and priority) label on the
  LeaderWorkerSet and, on both templates, Kueue's required-topology annotation on the clique and
  one podset group name, so Kueue admits a group whole and packs it into one rack (kueue.md); with
  ``burstPriorityClass`` the priority label names that class (``controller.capacity``);
- the leader's startup probe allows ``probes.loadTimeout`` for the ~1.5 TB load (F12); workers
  get no HTTP probes (headless ranks serve no HTTP);
- drained exits: a pod that goes runs the launcher's ``drain`` as its preStop hook
  (``kimik3.engine.launcher``): the leader fails its readiness probe (the launcher's ``ready``,
  which is vLLM's /health until the drain begins) for ``deregister_s``, so the Service and the
  endpoint picker stop sending to it, then vLLM finishes the requests in flight for up to
  ``probes.drainTimeout`` (``--shutdown-timeout``); a worker keeps its rank up until the leader
  is gone. ``termination_grace_s`` covers the three steps and vLLM's teardown.
"""

from __future__ import annotations

import math
from typing import Any

from kimik3.admission import Admitted
from kimik3.engine.args import (
    API_KEY_ENV,
    API_PORT_NAME,
    COMPILE_CACHE_MOUNT,
    HUB_TOKEN_ENV,
    engine_env,
    shutdown_timeout_s,
)
from kimik3.engine.kvcache import offload_bytes_per_pod, offload_shm_bytes
from kimik3.engine.weights import MODEL_MOUNT
from kimik3.kube.kinds import LEADER_WORKER_SET
from kimik3.kube.quantities import gibibytes, quantity_bytes
from kimik3.kube.labels import (
    GPU_RESOURCE,
    KUEUE_PODSET_GROUP,
    KUEUE_PRIORITY_CLASS_LABEL,
    KUEUE_QUEUE_NAME_LABEL,
    KUEUE_REQUIRED_TOPOLOGY,
    LWS_EXCLUSIVE_TOPOLOGY,
    PRODUCT_LABEL,
    ROLE_LABEL,
)
from kimik3.render import compilecache, computedomain, configmap
from kimik3.render.revision import TEMPLATE_HASH_ANNOTATION, template_hash
from kimik3.render.meta import Owner, engine_set_name

PLAN_HASH_ANNOTATION = "inference.kimik3.io/plan-hash"
KUEUE_GROUP_NAME = "engine-group"
"""The podset group name on both templates: Kueue places a group's leader and workers together."""
CONTAINER = "engine"
READINESS_FAILURE_THRESHOLD = 3
"""Failed readiness probes in a row before the kubelet marks the leader not Ready (a /health blip
of one period does not take a group out of the endpoints)."""
DEREGISTER_MARGIN_S = 5
"""After the kubelet marks a draining leader not Ready, how long its watchers take to act on it,
seconds: the EndpointSlice controller, kube-proxy and the endpoint picker see it through watches
(well under a second each on an idle control plane; 5 s leaves room for a busy one)."""
TEARDOWN_S = 30
"""vLLM's own exit once the requests are done (engine processes stop, GPU memory and NCCL
communicators are freed), seconds, within the termination grace period."""


def deregister_s(admitted: Admitted) -> int:
    """How long a draining leader fails readiness before SIGTERM (its preStop hook), seconds:
    ``probes.periodSeconds`` x READINESS_FAILURE_THRESHOLD (the kubelet's longest wait to see
    the probe fail that many times) + DEREGISTER_MARGIN_S; 35 s by default."""
    return admitted.spec.probes.period_seconds * READINESS_FAILURE_THRESHOLD + DEREGISTER_MARGIN_S


def termination_grace_s(admitted: Admitted) -> int:
    """The engine pods' terminationGracePeriodSeconds: ``deregister_s`` + ``probes.drainTimeout``
    (vLLM's --shutdown-timeout) + TEARDOWN_S; 245 s by default."""
    return deregister_s(admitted) + shutdown_timeout_s(admitted.spec) + TEARDOWN_S


def _launcher_command(*args: str) -> list[str]:
    """The in-pod launcher with ``args`` (the container's command runs it without arguments)."""
    return ["python3", f"{configmap.MOUNT_PATH}/{configmap.LAUNCHER_KEY}", *args]


def _engine_env(admitted: Admitted) -> dict[str, str]:
    return engine_env(admitted.spec, admitted.plan, admitted.seconds.load_timeout)


def _shm_size(admitted: Admitted) -> str:
    """``engine.shmSize``, plus what the host KV tier needs in /dev/shm (``kvcache.offload_shm_bytes``)."""
    shm, extra = admitted.spec.engine.shm_size, offload_shm_bytes(admitted.spec)
    return gibibytes(quantity_bytes(shm) + extra) if extra else shm


def _volumes(owner: Owner, admitted: Admitted) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    spec = admitted.spec
    src = spec.model.source
    volumes: list[dict[str, Any]] = [
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": _shm_size(admitted)}},
        {"name": configmap.VOLUME, "configMap": {"name": configmap.configmap_name(owner, admitted),
                                                 "defaultMode": 0o444}},
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "dshm", "mountPath": "/dev/shm"},
        {"name": configmap.VOLUME, "mountPath": configmap.MOUNT_PATH, "readOnly": True},
    ]
    claim = src.pvc.claim_name if src.pvc is not None else src.cache.claim_name if src.cache is not None else None
    if claim is not None:
        volumes.append({"name": "model", "persistentVolumeClaim": {"claimName": claim, "readOnly": True}})
        mounts.append({"name": "model", "mountPath": MODEL_MOUNT, "readOnly": True})
    elif src.host_path is not None:
        volumes.append({"name": "model", "hostPath": {"path": src.host_path.path, "type": "Directory"}})
        mounts.append({"name": "model", "mountPath": MODEL_MOUNT, "readOnly": True})
    elif src.hub is not None:  # admission leaves exactly one source
        volumes.append({"name": "hf-cache", "emptyDir": {"sizeLimit": src.hub.cache_size}})
        mounts.append({"name": "hf-cache", "mountPath": "/hf-cache"})
    compile_claim = compilecache.claim_name(admitted)
    if compile_claim is not None:
        volumes.append({"name": "compile-cache", "persistentVolumeClaim": {"claimName": compile_claim}})
        mounts.append({"name": "compile-cache", "mountPath": COMPILE_CACHE_MOUNT})
    return volumes, mounts


def _env(admitted: Admitted) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in sorted(_engine_env(admitted).items())]
    env.append({"name": "KIMIK3_PLAN", "value": f"{configmap.MOUNT_PATH}/{configmap.PLAN_KEY}"})
    hub = admitted.spec.model.source.hub
    if hub is not None and hub.token_secret is not None:
        env.append({"name": HUB_TOKEN_ENV, "valueFrom": {"secretKeyRef": {
            "name": hub.token_secret.name, "key": hub.token_secret.key}}})
    return env


def _probes(admitted: Admitted) -> dict[str, Any]:
    p = admitted.spec.probes
    health = {"httpGet": {"path": "/health", "port": API_PORT_NAME}, "periodSeconds": p.period_seconds,
              "timeoutSeconds": 5}
    budget = math.ceil(admitted.seconds.load_timeout / p.period_seconds)
    return {
        "startupProbe": {**health, "failureThreshold": budget},
        "livenessProbe": {**health, "failureThreshold": p.liveness_failure_threshold},
        "readinessProbe": {"exec": {"command": _launcher_command("ready", str(admitted.spec.service.port))},
                           "periodSeconds": p.period_seconds, "timeoutSeconds": 5,
                           "failureThreshold": READINESS_FAILURE_THRESHOLD},
    }


def pod_template(owner: Owner, admitted: Admitted, serves_api: bool, channel_claims: bool = True) -> dict[str, Any]:
    """Pod template of a leader (``serves_api``: ports and /health probes) or a headless worker;
    ``channel_claims``: claim the ComputeDomain's IMEX channel (multi-tray NVL72 groups)."""
    spec, plan = admitted.spec, admitted.plan
    claims = plan.needs_compute_domain and channel_claims
    volumes, mounts = _volumes(owner, admitted)
    limits: dict[str, Any] = {GPU_RESOURCE: plan.gpus_per_node}
    if spec.engine.resources.cpu:
        limits["cpu"] = spec.engine.resources.cpu
    tier = offload_bytes_per_pod(spec)
    if spec.engine.resources.memory:
        limits["memory"] = gibibytes(quantity_bytes(spec.engine.resources.memory) + tier) if tier else \
            spec.engine.resources.memory
    resources: dict[str, Any] = {"limits": limits, "requests": dict(limits)}
    if tier and not spec.engine.resources.memory:  # no limit to raise: request the tier alone
        resources["requests"]["memory"] = gibibytes(tier)
    if claims:
        resources["claims"] = [{"name": computedomain.CLAIM_NAME}]
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": spec.engine.image,
        "imagePullPolicy": spec.engine.image_pull_policy,
        "command": _launcher_command(),
        "lifecycle": {"preStop": {"exec": {"command": _launcher_command(
            "drain", str(deregister_s(admitted)), str(shutdown_timeout_s(spec)))}}},
        "env": _env(admitted),
        "resources": resources,
        "volumeMounts": mounts,
        "securityContext": {"allowPrivilegeEscalation": False, "privileged": False},
    }
    if serves_api and spec.service.api_key_secret is not None:
        # vLLM reads VLLM_API_KEY when no --api-key is given (admission refuses both in the spec
        # itself: kimik3.admission.api_keys); only API servers get the key.
        ref = spec.service.api_key_secret
        container["env"] = [*container["env"],
                            {"name": API_KEY_ENV, "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}}]
    if serves_api:
        container["ports"] = [{"name": API_PORT_NAME, "containerPort": spec.service.port, "protocol": "TCP"}]
        container.update(_probes(admitted))
    sched = spec.scheduling
    pod: dict[str, Any] = {
        "containers": [container],
        "volumes": volumes,
        "nodeSelector": node_selector(admitted),
        "terminationGracePeriodSeconds": termination_grace_s(admitted),
        "enableServiceLinks": False,
    }
    if sched.tolerations:
        pod["tolerations"] = [t.model_dump(by_alias=True, exclude_none=True) for t in sched.tolerations]
    if sched.priority_class_name:
        pod["priorityClassName"] = sched.priority_class_name
    if sched.scheduler_name:
        pod["schedulerName"] = sched.scheduler_name
    if claims:
        pod["resourceClaims"] = [{"name": computedomain.CLAIM_NAME,
                                  "resourceClaimTemplateName": computedomain.channel_template_name(owner)}]
    labels = {**owner.labels(), ROLE_LABEL: "leader" if serves_api else "worker"}
    return {"metadata": {"labels": labels, "annotations": {PLAN_HASH_ANNOTATION: configmap.plan_hash(admitted)}},
            "spec": pod}


def node_selector(admitted: Admitted) -> dict[str, str]:
    """The node labels every engine pod requires: the GPU product and architecture of the plan's
    accelerator, and ``spec.scheduling.nodeSelector`` (its node pool)."""
    plan = admitted.plan
    return {PRODUCT_LABEL: plan.profile.product_label, "kubernetes.io/arch": plan.profile.arch,
            **admitted.spec.scheduling.node_selector}


def leader_worker_set(owner: Owner, admitted: Admitted, replicas: int, channel_claims: bool = True) -> dict[str, Any]:
    """The LeaderWorkerSet with ``replicas`` groups of ``plan.nodes_per_group`` pods. Its
    templates never change once it exists (``controller.fleet`` rolls a change out through a new
    one), so it needs no ``rolloutStrategy``."""
    spec, plan = admitted.spec, admitted.plan
    placement = spec.scheduling.placement
    template: dict[str, Any] = {"size": plan.nodes_per_group, "restartPolicy": "RecreateGroupOnPodRestart"}
    if plan.multi_node:
        template["leaderTemplate"] = pod_template(owner, admitted, True, channel_claims)
        template["workerTemplate"] = pod_template(owner, admitted, False, channel_claims)
    else:
        template["workerTemplate"] = pod_template(owner, admitted, True, channel_claims)
    meta = owner.metadata(engine_set_name(owner.name))
    if placement.mode == "kueue":
        meta["labels"][KUEUE_QUEUE_NAME_LABEL] = placement.queue_name
        # With burst capacity every Workload starts at the burst class; the operator raises the
        # reserved groups' (controller.capacity): one template cannot tell groups apart.
        priority_class = placement.burst_priority_class or placement.priority_class
        if priority_class:
            meta["labels"][KUEUE_PRIORITY_CLASS_LABEL] = priority_class
        if plan.clique_placement:
            # Kueue TAS (kueue.md): both podsets of a group in one domain of the topology key.
            # Kueue ignores pod (anti-)affinity, so no exclusive-topology annotation beside it.
            for key in ("leaderTemplate", "workerTemplate"):
                template[key]["metadata"]["annotations"] |= {KUEUE_REQUIRED_TOPOLOGY: spec.scheduling.topology_key,
                                                             KUEUE_PODSET_GROUP: KUEUE_GROUP_NAME}
    elif plan.clique_placement:
        meta["annotations"] = {LWS_EXCLUSIVE_TOPOLOGY: spec.scheduling.topology_key}
    meta["annotations"] = {**meta.get("annotations", {}), TEMPLATE_HASH_ANNOTATION: template_hash(template)}
    return {
        "apiVersion": LEADER_WORKER_SET.api_version,
        "kind": LEADER_WORKER_SET.kind,
        "metadata": meta,
        "spec": {
            "replicas": replicas,
            "startupPolicy": "LeaderCreated",
            "leaderWorkerTemplate": template,
        },
    }
