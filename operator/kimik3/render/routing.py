"""Routing by prefix and load (``spec.routing``): an InferencePool of the group leaders and the
endpoint picker (EPP) the gateway asks which leader gets each request.

The objects follow the Gateway API Inference Extension v1.2.1 (``sigs.k8s.io/gateway-api-inference-extension``):
the InferencePool is ``inference.networking.k8s.io/v1`` (``api/v1/inferencepool_types.go``), the
picker is that release's ``cmd/epp``, its flags read in ``cmd/epp/runner/runner.go`` and its
configuration file an ``EndpointPickerConfig`` (``apix/config/v1alpha1``); the Deployment,
Service, ConfigMap, ServiceAccount, Role and RoleBinding are laid out as the release's own chart
(``config/charts/inferencepool``) lays them out, with these differences:

- the pool selects the group leaders only (worker index 0: the workers of a multi-node group
  serve no HTTP), on the engine's port (``spec.service.port``);
- the prefix scorer is configured for Kimi K3 (``PREFIX_BLOCK_CHARACTERS``, ``max_prefix_blocks``)
  instead of the defaults, which assume a 16-token vLLM block and 16K characters of prefix, and
  with a host KV tier (``spec.engine.kvOffload``) its index holds what each leader's engines hold
  in GPU and host memory (``prefix_scorer``);
- the KV-cache metric is vLLM 0.33's name (the picker's default is the pre-0.10 name);
- the Role reads only this deployment's InferencePool by name (the picker watches it with a
  ``metadata.name`` field selector), the pods and the InferenceObjectives of the namespace, and
  the metrics endpoint is served without authentication so that no ClusterRole (token and
  access reviews) is needed; the Service is ClusterIP.

Every object is named ``<deployment>-epp`` except the InferencePool, named like the deployment
(as its Service and HTTPRoute are).
"""

from __future__ import annotations

from typing import Any


from kimik3.api.documents import dump_yaml
from kimik3.api.v1alpha1 import K3_CONTEXT_TOKENS, KimiK3DeploymentSpec
from kimik3.engine.kvcache import KV_BLOCK_ALIGNMENT, spec_kv_blocks
from kimik3.engine.metrics import KV_USAGE
from kimik3.kube.kinds import (CONFIG_MAP, DEPLOYMENT, INFERENCE_OBJECTIVE, INFERENCE_POOL, POD, ROLE, ROLE_BINDING,
                               SERVICE, SERVICE_ACCOUNT, Kind)
from kimik3.render.meta import Owner
from kimik3.render.service import leader_selector
from kimik3.topology.plan import data_parallel_size

GRPC_PORT = 9002
"""The picker's ext_proc port, the one the InferencePool names (EPP ``--grpc-port`` default)."""
GRPC_HEALTH_PORT = 9003
"""The picker's gRPC health port (``--grpc-health-port`` default): its probes."""
METRICS_PORT = 9090
"""The picker's Prometheus metrics (``--metrics-port`` default)."""
HEALTH_SERVICE = "inference-extension"
"""The gRPC health service a single picker replica answers on (upstream chart, one replica)."""
CONFIG_FILE = "epp-config.yaml"
CONFIG_DIR = "/config"

CHARACTERS_PER_TOKEN = 4
"""The picker hashes the prompt's characters, not tokens (it does not tokenize): v1.2.1's prefix
scorer turns an engine block of N tokens into N x 4 characters (``averageCharactersPerToken``)."""
PREFIX_BLOCK_CHARACTERS = KV_BLOCK_ALIGNMENT * CHARACTERS_PER_TOKEN
"""``blockSize`` of the prefix-cache scorer until the engines report theirs: 128 tokens (the
alignment every K3 cache block is a multiple of, ``engine.kvcache``) x 4 characters = 512. With
``autoTune`` the picker then hashes in the engines' own block (``vllm:cache_config_info``'s
``block_size``, e.g. 1024 tokens at GB300 TP8) and sizes its index per engine from their
``num_gpu_blocks``: the unit in which vLLM finds a cached prefix."""
SCORER_WEIGHTS: dict[str, int] = {"queue-scorer": 2, "kv-cache-utilization-scorer": 2, "prefix-cache-scorer": 3}
"""Weights of the scorers (plugin type -> weight), as the v1.2.1 chart's default configuration has them."""
PICKER = "max-score-picker"
"""The leader with the highest weighted score wins (ties at random)."""


def picker_name(owner: Owner) -> str:
    """``<deployment>-epp``: the picker's Deployment, Service, ConfigMap, ServiceAccount, Role and RoleBinding."""
    return f"{owner.name}-epp"


def picker_labels(owner: Owner) -> dict[str, str]:
    """The picker's pods: the deployment's labels and its component."""
    return {**owner.labels(), "app.kubernetes.io/component": "endpoint-picker"}


def max_prefix_blocks(spec: KimiK3DeploymentSpec) -> int:
    """``maxPrefixBlocksToMatch``: enough blocks of the finest block the picker may hash in (128
    tokens) to cover the deployment's whole context (``model.maxModelLen``, else K3's 1,048,576
    tokens: 8192 blocks), so two prompts that share less than all of it are told apart. The
    picker's default, 256 blocks of 64 characters, looks at the first ~4K tokens only."""
    return -(-(spec.model.max_model_len or K3_CONTEXT_TOKENS) // KV_BLOCK_ALIGNMENT)


def prefix_scorer(spec: KimiK3DeploymentSpec) -> dict[str, Any]:
    """The prefix-cache scorer's parameters (v1.2.1 ``prefix.Config``). Without a host tier:
    ``autoTune``, so the picker hashes in the engines' block and sizes its index per leader
    (``lruCapacityPerServer``) from the ``num_gpu_blocks`` they report, with
    ``PREFIX_BLOCK_CHARACTERS`` until they do. With ``engine.kvOffload`` the engines hold more than
    their GPU blocks, and ``autoTune`` would size the index to those alone (``PreRequest`` takes
    ``CacheNumGPUBlocks`` over the configured capacity) and forget prefixes the host tier still
    serves: ``autoTune`` off, the block given as the engines cache in (``kvcache.spec_kv_blocks``:
    1024 tokens x 4 characters at GB300 TP8) and the capacity as the GPU and host blocks of every
    engine behind a leader (896 + 2446 at TP8 with a 1000Gi tier)."""
    prefix: dict[str, Any] = {"autoTune": True, "blockSize": PREFIX_BLOCK_CHARACTERS,
                              "maxPrefixBlocksToMatch": max_prefix_blocks(spec)}
    if spec.engine.kv_offload is not None:
        kv = spec_kv_blocks(spec)
        prefix |= {"autoTune": False, "blockSize": kv.block_size * CHARACTERS_PER_TOKEN,
                   "lruCapacityPerServer": (kv.blocks + kv.host_blocks) * data_parallel_size(spec.topology)}
    return prefix


def picker_config(spec: KimiK3DeploymentSpec) -> dict[str, Any]:
    """The ``EndpointPickerConfig`` (v1.2.1 ``apix/config/v1alpha1``): the three scorers and the picker,
    one scheduling profile; the prefix scorer's parameters as ``prefix_scorer`` says."""
    prefix = prefix_scorer(spec)
    plugins: list[dict[str, Any]] = [{"type": kind} for kind in SCORER_WEIGHTS]
    for plugin in plugins:
        if plugin["type"] == "prefix-cache-scorer":
            plugin["parameters"] = prefix
    plugins.append({"type": PICKER})
    return {
        "apiVersion": "inference.networking.x-k8s.io/v1alpha1",
        "kind": "EndpointPickerConfig",
        "plugins": plugins,
        "schedulingProfiles": [{"name": "default", "plugins": [
            *({"pluginRef": kind, "weight": weight} for kind, weight in SCORER_WEIGHTS.items()),
            {"pluginRef": PICKER}]}],
    }


def picker_args(owner: Owner) -> list[str]:
    """The picker's flags (v1.2.1 ``cmd/epp/runner``)."""
    return ["--pool-name", owner.name, "--pool-namespace", owner.namespace,
            "--config-file", f"{CONFIG_DIR}/{CONFIG_FILE}",
            "--kv-cache-usage-percentage-metric", KV_USAGE,
            "--metrics-endpoint-auth=false", "--tracing=false"]


def inference_pool(owner: Owner, spec: KimiK3DeploymentSpec) -> dict[str, Any]:
    """The pool: the group leaders on the engine's port, scored by the picker's Service."""
    return {
        "apiVersion": INFERENCE_POOL.api_version, "kind": INFERENCE_POOL.kind, "metadata": owner.metadata(owner.name),
        "spec": {
            "selector": {"matchLabels": leader_selector(owner)},
            "targetPorts": [{"number": spec.service.port}],
            "endpointPickerRef": {"group": SERVICE.group, "kind": SERVICE.kind, "name": picker_name(owner),
                                  "port": {"number": GRPC_PORT},
                                  "failureMode": spec.routing.endpoint_picker.failure_mode},
        },
    }


def _rule(kind: Kind, names: list[str] | None = None) -> dict[str, Any]:
    rule: dict[str, Any] = {"apiGroups": [kind.group], "resources": [kind.plural], "verbs": ["get", "list", "watch"]}
    if names:
        rule["resourceNames"] = names
    return rule


def endpoint_picker(owner: Owner, spec: KimiK3DeploymentSpec) -> list[dict[str, Any]]:
    """The picker's ServiceAccount, Role, RoleBinding, ConfigMap, Deployment and Service, in that order."""
    name, labels = picker_name(owner), picker_labels(owner)
    selector = {k: labels[k] for k in ("app.kubernetes.io/instance", "app.kubernetes.io/component")}
    account = {"apiVersion": SERVICE_ACCOUNT.api_version, "kind": SERVICE_ACCOUNT.kind, "metadata": owner.metadata(name)}
    role = {"apiVersion": ROLE.api_version, "kind": ROLE.kind, "metadata": owner.metadata(name),
            "rules": [_rule(INFERENCE_POOL, [owner.name]), _rule(POD), _rule(INFERENCE_OBJECTIVE)]}
    binding = {"apiVersion": ROLE_BINDING.api_version, "kind": ROLE_BINDING.kind, "metadata": owner.metadata(name),
               "roleRef": {"apiGroup": ROLE.group, "kind": ROLE.kind, "name": name},
               "subjects": [{"kind": SERVICE_ACCOUNT.kind, "name": name, "namespace": owner.namespace}]}
    config = {"apiVersion": CONFIG_MAP.api_version, "kind": CONFIG_MAP.kind, "metadata": owner.metadata(name),
              "data": {CONFIG_FILE: dump_yaml(picker_config(spec))}}
    health = {"grpc": {"port": GRPC_HEALTH_PORT, "service": HEALTH_SERVICE}}
    container = {
        "name": "epp", "image": spec.routing.endpoint_picker.image, "args": picker_args(owner),
        "ports": [{"name": "grpc", "containerPort": GRPC_PORT, "protocol": "TCP"},
                  {"name": "grpc-health", "containerPort": GRPC_HEALTH_PORT, "protocol": "TCP"},
                  {"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"}],
        "env": [{"name": "NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
        "livenessProbe": {**health, "initialDelaySeconds": 5, "periodSeconds": 10},
        "readinessProbe": {**health, "periodSeconds": 2},
        "volumeMounts": [{"name": "config", "mountPath": CONFIG_DIR, "readOnly": True}],
    }
    deployment = {
        "apiVersion": DEPLOYMENT.api_version, "kind": DEPLOYMENT.kind, "metadata": owner.metadata(name),
        "spec": {
            # One replica, replaced by Recreate: the prefix scorer's index lives in the picker's memory,
            # and two pickers would each see half the requests (the upstream chart's reason).
            "replicas": 1, "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": selector},
            "template": {"metadata": {"labels": labels}, "spec": {
                "serviceAccountName": name, "containers": [container],
                "volumes": [{"name": "config", "configMap": {"name": name}}]}},
        },
    }
    service = {"apiVersion": SERVICE.api_version, "kind": SERVICE.kind, "metadata": owner.metadata(name),
               "spec": {"type": "ClusterIP", "selector": selector, "ports": [
                   {"name": "grpc-ext-proc", "port": GRPC_PORT, "targetPort": GRPC_PORT, "protocol": "TCP"},
                   {"name": "http-metrics", "port": METRICS_PORT, "targetPort": METRICS_PORT, "protocol": "TCP"}]}}
    return [account, role, binding, config, deployment, service]
