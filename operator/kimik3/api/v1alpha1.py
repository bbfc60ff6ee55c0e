"""KimiK3Deployment v1alpha1: the spec a user writes and the status the operator reports.

These pydantic models are the single source of the CRD (``kimik3 crd`` generates ``crds/``
from them): field docstrings become the OpenAPI descriptions ``kubectl explain`` shows, and the
``x-kubernetes-validations`` CEL rules attached here are enforced by the API server itself. Each
CEL rule has a name (``CEL_RULES``); ``kimik3.admission`` tables each beside the Python check the
operator runs for the same specs (``kimik3 validate``, every reconcile).
Python names are snake_case; the Kubernetes names are their camelCase aliases.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue
from pydantic.alias_generators import to_camel
from pydantic.config import JsonDict

from kimik3.api.conditions import ConditionStatus
from kimik3.kube.accelerators import MODEL_MEMORY_FLOOR_GB, PROFILES, Accelerator
from kimik3.kube.workloads import KueueState

DURATION_PATTERN = r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$"
Duration = Annotated[str, Field(pattern=DURATION_PATTERN, max_length=32)]
"""A Go-style duration such as ``5ms``, ``90s``, ``1h30m``."""

_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def duration_seconds(value: str) -> float:
    """Seconds in a duration string (``"1h30m"`` -> 5400.0, ``"5ms"`` -> 0.005).

    Raises ValueError when the string is not a duration of the ``Duration`` pattern."""
    if not re.fullmatch(DURATION_PATTERN, value):
        raise ValueError(f"not a duration (e.g. 5ms, 90s, 1h30m): {value!r}")
    return sum(float(n) * _UNIT_SECONDS[u] for n, u in _DURATION_PART.findall(value))


SIZE_PATTERN = r"^[0-9]+(Gi|Ti)$"
"""A storage or memory size in whole GiB or TiB, e.g. ``200Gi``, ``2Ti``."""
SHM_SIZE_PATTERN = r"^[0-9]+(Mi|Gi)$"
CPU_PATTERN = r"^[0-9]+(\.[0-9]+)?m?$"
MEMORY_PATTERN = r"^[0-9]+(Ki|Mi|Gi|Ti)?$"
PERCENT_PATTERN = r"^[0-9]{1,3}%$"
ABSOLUTE_PATH_PATTERN = r"^/.*"
PATH_PREFIX_PATTERN = r"^/"
HUB_URL_PATTERN = r"^https?://[^\s]+$"
PROMETHEUS_URL_PATTERN = r"^https?://"
ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"


def cel_not_duration(path: str) -> str:
    """CEL: the string at ``path`` is not a duration of ``DURATION_PATTERN``. A rule that reads a
    duration passes such a string (``!has(x) || <this> || duration(x) ...``): the pattern already
    refuses it with its own error, and ``duration()`` on it would add the API server's
    type-conversion error beside that one (``idle.stopAfter: soon`` printed both, 2026-12-05)."""
    return f"!{path}.matches(r'{DURATION_PATTERN}')"


def _cel_map(values: dict[str, int]) -> str:
    return "{" + ", ".join(f"'{k}': {v}" for k, v in values.items()) + "}"


GPUS_PER_NODE_CEL = _cel_map({k: p.gpus_per_node for k, p in PROFILES.items()})
GPU_MEMORY_GB_CEL = _cel_map({k: p.gpu_memory_gb for k, p in PROFILES.items()})
MEMORY_FLOOR_GB_CEL = _cel_map(MODEL_MEMORY_FLOOR_GB)
RACK_GPUS_CEL = _cel_map({k: p.gpus_per_node * p.nvlink_domain_nodes for k, p in PROFILES.items()
                          if p.multi_node_nvlink})
"""GPUs of one NVLink domain spanning trays (an NVL72 rack), for the accelerators that have one."""
K3_CONTEXT_TOKENS = 1_048_576
"""Kimi K3's context, tokens (``--max-model-len 1048576``): the most ``model.maxModelLen`` allows."""
MEGAKERNEL_ACCELERATORS = [k for k, p in PROFILES.items() if p.megakernel_capable]
"""Accelerators vLLM 0.33's specialised decode path runs on (the SM100/SM103 family)."""


CEL_RULES: dict[str, JsonDict] = {}
"""Every CEL rule of the CRD by its name (``rule(name, ...)``). The name is the rule's identity in
``kimik3.admission``'s tables, where each Python check names the CEL rules it mirrors; it is not
written into the CRD (``x-kubernetes-validations`` entries have no name field)."""


def rule(name: str, cel: str, message: str, field_path: str | None = None) -> JsonDict:
    """One ``x-kubernetes-validations`` entry (CEL evaluated by the API server on admission),
    registered in ``CEL_RULES`` as ``name``. Raises ValueError when the name or the CEL text is
    already taken (an entry must map back to exactly one name)."""
    if name in CEL_RULES or any(e["rule"] == cel for e in CEL_RULES.values()):
        raise ValueError(f"CEL rule {name!r} is declared twice")
    entry: JsonDict = {"rule": cel, "message": message}
    if field_path:
        entry["fieldPath"] = field_path
    CEL_RULES[name] = entry
    return entry


def validated_by(*rules: JsonDict) -> ConfigDict:
    """The ``model_config`` of a model whose schema carries these CEL rules."""
    entries: list[JsonValue] = list(rules)
    return ConfigDict(json_schema_extra={"x-kubernetes-validations": entries})


class Model(BaseModel):
    """Base: camelCase aliases, unknown fields refused, docstrings as descriptions."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        use_attribute_docstrings=True,
        validate_default=True,
    )


# ---------------------------------------------------------------- model ---------------------


class SecretKeyRef(Model):
    """A key of a Secret in the deployment's namespace."""

    name: str = Field(min_length=1, max_length=253)
    """Secret name."""
    key: str = Field(min_length=1, max_length=253)
    """Key inside the Secret."""


class PVCSource(Model):
    """Weights pre-staged on a PersistentVolumeClaim (recommended: a 1.5 TB checkpoint)."""

    claim_name: str = Field(min_length=1, max_length=253)
    """Name of the PersistentVolumeClaim holding the checkpoint."""
    sub_path: str | None = Field(default=None, max_length=1024)
    """Folder inside the volume that holds config.json and the safetensors shards."""


class HostPathSource(Model):
    """Weights pre-staged on every GPU node's local disk."""

    path: str = Field(pattern=ABSOLUTE_PATH_PATTERN, max_length=1024)
    """Absolute path of the checkpoint folder on the node."""


class HubSource(Model):
    """Weights downloaded from the Hugging Face hub at start (slow: ~1.5 TB per group)."""

    token_secret: SecretKeyRef | None = None
    """Secret key holding an HF token, passed to the engine as HF_TOKEN."""
    cache_size: str = Field(default="2Ti", pattern=SIZE_PATTERN)
    """Size of the emptyDir that caches the download on each node."""


class VolumeClaimCreate(Model):
    """A PersistentVolumeClaim the operator creates for the model cache (kept when the deployment goes)."""

    storage_class_name: str | None = Field(default=None, max_length=253)
    """StorageClass of the claim (unset: the cluster's default class)."""
    size: str = Field(default="2Ti", pattern=SIZE_PATTERN)
    """Requested capacity: the target (~1.5 TB for Kimi K3) plus its drafter, plus room for one more revision of each."""
    access_mode: Literal["ReadWriteMany", "ReadOnlyMany", "ReadWriteOnce", "ReadWriteOncePod"] = "ReadWriteMany"
    """Access mode. Groups span trays (nodes), so every engine pod mounts it read-only from its own node: ReadWriteMany (or ReadOnlyMany once staged) unless the group is one node."""


class CacheHubSource(Model):
    """Stage the cache from a Hugging Face hub: the target (spec.model.name at spec.model.revision) and the drafter (spec.speculativeDecoding.draftModel at draftRevision)."""

    token_secret: SecretKeyRef | None = None
    """Secret key holding an HF token, given to the staging Job only (never to the engines) as HF_TOKEN."""
    endpoint: str | None = Field(default=None, pattern=HUB_URL_PATTERN, max_length=512)
    """Base URL of the hub (HF_ENDPOINT), e.g. a mirror inside the cluster. Unset: https://huggingface.co."""


class ModelCacheSource(Model):
    """Weights and drafter on a PersistentVolumeClaim of the namespace, staged by the operator's Job before any GPU is claimed.

    Layout: <repo id>/<revision>/ for the target and for the drafter (e.g. moonshotai/Kimi-K3/main,
    Inferact/Kimi-K3-DSpark/main), each with a completion manifest .kimik3-staged.json. Several
    deployments of one namespace may name the same claim: each revision is staged once."""

    model_config = validated_by(rule(
        "model-cache-hub-or-declared-ready", "has(self.hub) != (has(self.declaredReady) && self.declaredReady)",
        "set exactly one of hub (the operator stages the cache) or declaredReady: true (the volume already holds "
        "the layout <repo id>/<revision>/)"))
    claim_name: str = Field(min_length=1, max_length=253)
    """Name of the PersistentVolumeClaim (created by the operator when create is set, else it must exist)."""
    create: VolumeClaimCreate | None = None
    """Create the claim (unless it exists); unset: the claim exists already."""
    hub: CacheHubSource | None = None
    """Stage target and drafter from the hub into the claim."""
    declared_ready: bool = False
    """The volume already holds target and drafter at <repo id>/<revision>/: nothing is staged or verified."""


class ModelSource(Model):
    """Where the weights come from: exactly one of pvc, hostPath, hub, cache."""

    model_config = validated_by(rule(
        "model-source-exactly-one",
        "[has(self.pvc), has(self.hostPath), has(self.hub), has(self.cache)].filter(x, x).size() == 1",
        "set exactly one of pvc, hostPath, hub, cache"))
    pvc: PVCSource | None = None
    """Read the checkpoint from a PersistentVolumeClaim (mounted read-only)."""
    host_path: HostPathSource | None = None
    """Read the checkpoint from a folder on the node."""
    hub: HubSource | None = None
    """Download the checkpoint from the hub named by spec.model.name."""
    cache: ModelCacheSource | None = None
    """A model cache on a PersistentVolumeClaim: target and drafter staged from the hub (or declared ready) before any engine pod is created; the engines load them offline."""


class ModelFeatures(Model):
    """Serving features of Kimi K3 in vLLM."""

    tool_calling: bool = True
    """--enable-auto-tool-choice --tool-call-parser kimi_k3."""
    reasoning_parser: bool = True
    """--reasoning-parser kimi_k3."""
    prefix_caching: bool = True
    """--enable-prefix-caching; false: --no-enable-prefix-caching (vLLM 0.33 turns it on for K3, a hybrid model, unless told)."""
    language_model_only: bool = True
    """--language-model-only: skip the vision tower."""


class ModelSpec(Model):
    """The model served."""

    name: str = Field(default="moonshotai/Kimi-K3", min_length=1, max_length=256)
    """Hugging Face id of the checkpoint (also the hub id when source is hub)."""
    revision: str | None = Field(default=None, max_length=128)
    """Hub revision (branch, tag or commit) to pin."""
    variant: Literal["mxfp4", "nvfp4"] = "mxfp4"
    """Weight format: mxfp4 (moonshotai/Kimi-K3, ~1680 GB of GPU memory) or nvfp4 (RedHatAI/Kimi-K3-NVFP4, ~1650 GB)."""
    served_model_name: str = Field(default="kimi-k3", min_length=1, max_length=128)
    """Name clients put in the OpenAI "model" field; also the model_name label of the metrics."""
    max_model_len: int | None = Field(default=None, ge=1024, le=K3_CONTEXT_TOKENS)
    """Context length in tokens (Kimi K3: up to 1048576). Unset: the model's own."""
    source: ModelSource
    """Where the weights come from."""
    features: ModelFeatures = Field(default_factory=ModelFeatures)
    """Tool calling, reasoning parser, prefix caching, text-only."""


# ---------------------------------------------------------------- engine --------------------

ENGINE_IMAGE = "vllm/vllm-openai:v0.33.0"
"""The pinned engine: vLLM 0.33.0 (CUDA 13, torch 2.14.0), the first release with the megakernel decode path."""


class EnvVar(Model):
    """A literal environment variable for the engine container."""

    name: str = Field(pattern=ENV_NAME_PATTERN, max_length=128)
    """Variable name."""
    value: str = Field(default="", max_length=4096)
    """Variable value."""


class Resources(Model):
    """CPU and memory of each engine pod (GPUs come from the topology)."""

    cpu: str | None = Field(default=None, pattern=CPU_PATTERN)
    """CPU request and limit, e.g. "64"."""
    memory: str | None = Field(default=None, pattern=MEMORY_PATTERN)
    """Memory request and limit, e.g. "800Gi"; engine.kvOffload adds its per-pod share (unset: the pod requests that share alone, with no limit)."""


class CompileCacheSpec(Model):
    """vLLM's compile caches on a PersistentVolumeClaim of the namespace (one per engine image and group plan), so a second start of the same engine skips compilation."""

    size: str = Field(default="200Gi", pattern=SIZE_PATTERN)
    """Capacity of each cache claim."""
    storage_class_name: str | None = Field(default=None, max_length=253)
    """StorageClass of the claims (unset: the cluster's default)."""
    access_mode: Literal["ReadWriteMany", "ReadWriteOnce"] = "ReadWriteMany"
    """Every rank of a multi-node group writes its own subfolder from its own node: ReadWriteMany unless groups are one node."""


class KVOffloadSpec(Model):
    """A second KV-cache tier in the pods' host memory (vLLM 0.33's native CPU offloading, ``--kv-offloading-size`` and ``--kv-offloading-backend``): cache blocks the GPUs evict are kept in CPU memory and copied back when a prompt needs them (on GB300 over NVLink-C2C) instead of being prefilled again."""

    size: str = Field(pattern=SIZE_PATTERN, max_length=16)
    """Host memory of each engine's tier, summed over its ranks (vLLM's --kv-offloading-size: "the total buffer size summed across all TP ranks"), e.g. 700Gi for a GB300 TP8 group puts 350Gi on each of its 2 trays. Each pod's memory request grows by its ranks' share and its /dev/shm by the tier (vLLM maps it from /dev/shm); the pod must still fit a node's memory."""
    backend: Literal["native"] = "native"
    """native: vLLM's own CPU offloading (its OffloadingConnector, which handles K3's hybrid KDA/MLA cache). lmcache is not offered: vLLM 0.33 runs it in multi-process mode, against an LMCache server the operator does not deploy, and does not pass it the size."""


class EngineSpec(Model):
    """The vLLM engine: image, decode path, kernels and batch limits."""

    model_config = validated_by(
        rule(
            "batched-tokens-cover-seqs",
            "self.maxNumBatchedTokens >= self.maxNumSeqs",
            "maxNumBatchedTokens must be >= maxNumSeqs: vLLM refuses to start otherwise (one step holds at least "
            "one token per sequence); raise maxNumBatchedTokens or lower maxNumSeqs",
            ".maxNumBatchedTokens",
        ),
        rule(
            "api-key-not-in-env",
            "!has(self.env) || !self.env.exists(e, e.name == 'VLLM_API_KEY')",
            "VLLM_API_KEY in env would be the API key in plain text in the CR: put the key in a Secret "
            "and name it in spec.service.apiKeySecret",
            ".env",
        ),
        rule(
            "api-key-not-in-extra-args",
            "!has(self.extraArgs) || !self.extraArgs.exists(a, a.matches('^--api[-_]key([=.].*)?$'))",
            "--api-key in extraArgs would put the API key in plain text in the CR and its launcher ConfigMap: "
            "put the key in a Secret and name it in spec.service.apiKeySecret",
            ".extraArgs",
        ),
        rule(
            "hub-token-not-in-env",
            "!has(self.env) || !self.env.exists(e, e.name == 'HF_TOKEN' || e.name == 'HUGGING_FACE_HUB_TOKEN')",
            "HF_TOKEN in env would be the hub token in plain text in the CR: put the token in a Secret and name it "
            "in spec.model.source.hub.tokenSecret (or spec.model.source.cache.hub.tokenSecret)",
            ".env",
        ),
        rule(
            "hub-token-not-in-extra-args",
            "!has(self.extraArgs) || !self.extraArgs.exists(a, a.matches('^--hf[-_]token([=.].*)?$'))",
            "--hf-token in extraArgs would put the hub token in plain text in the CR and its launcher ConfigMap: "
            "put the token in a Secret and name it in spec.model.source.hub.tokenSecret "
            "(or spec.model.source.cache.hub.tokenSecret)",
            ".extraArgs",
        ),
    )
    image: str = Field(default=ENGINE_IMAGE, min_length=1, max_length=512)
    """Engine image. Pinned at vLLM 0.33.0; the megakernel decode path needs >= 0.33.0."""
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    """Kubernetes image pull policy."""
    decode_backend: Literal["latency_specialized", "stock"] = "stock"
    """latency_specialized: vLLM 0.33's megakernel decode path (TP8/TP16 on SM100/SM103, no expert parallelism, speculative decoding off or dspark with <= 7 tokens). stock: the standard decode path."""
    moe_backend: Literal["auto", "flashinfer_trtllm", "deep_gemm_mega_moe", "flashinfer_cutlass", "triton"] | None = None
    """--moe-backend. flashinfer_trtllm for TP > 1; deep_gemm_mega_moe for DEP inside one NVL72 rack."""
    all2all_backend: Annotated[Literal["flashinfer_nvlink_one_sided", "flashinfer_nvlink_two_sided", "deepep_v2", "deepep_low_latency", "deepep_high_throughput", "allgather_reducescatter", "naive"] | None, Field(alias="all2allBackend")] = None
    """--all2all-backend for expert parallelism. Unset with DEP: flashinfer_nvlink_one_sided on NVLink."""
    kv_cache_dtype: Literal["auto", "fp8", "fp8_e4m3", "fp8_e5m2", "bfloat16"] = "fp8"
    """--kv-cache-dtype. Kimi K3 recipes use fp8."""
    gpu_memory_utilization: float = Field(default=0.9, ge=0.5, le=0.98)
    """--gpu-memory-utilization: share of each GPU's memory vLLM may use (0.5-0.98)."""
    max_num_seqs: int = Field(default=256, ge=1, le=4096)
    """--max-num-seqs: most sequences in one engine step (batch limit)."""
    max_num_batched_tokens: int = Field(default=8192, ge=256, le=1048576)
    """--max-num-batched-tokens: most tokens in one engine step."""
    load_format: Literal["auto", "safetensors", "fastsafetensors", "runai_streamer"] | None = None
    """--load-format. fastsafetensors speeds the ~1.5 TB load on GB300 recipes."""
    cudagraph_mode: Literal["FULL_AND_PIECEWISE", "FULL_DECODE_ONLY", "FULL", "PIECEWISE"] | None = None
    """compilation_config.cudagraph_mode. The megakernel path needs FULL decode graphs."""
    enforce_eager: bool = False
    """--enforce-eager (no CUDA graphs; refused with the megakernel path)."""
    extra_args: list[Annotated[str, Field(max_length=4096)]] = Field(default_factory=list, max_length=64)
    """More vLLM flags, passed as given. Flags the operator sets itself are refused here: use their fields."""
    env: list[EnvVar] = Field(default_factory=list, max_length=64)
    """More environment variables for every engine container."""
    resources: Resources = Field(default_factory=Resources)
    """CPU and memory per pod."""
    compile_cache: CompileCacheSpec | None = None
    """Keep vLLM's torch.compile / Inductor / Triton / DeepGEMM JIT / FlashInfer autotune caches on a claim per engine image and group plan (VLLM_CACHE_ROOT), never shared across namespaces. Unset: every start compiles again."""
    shm_size: str = Field(default="200Gi", pattern=SHM_SIZE_PATTERN)
    """Size of the in-memory /dev/shm volume (NCCL and vLLM IPC; Dynamo's GB300 manifests use 200Gi). kvOffload's tier is added to it."""
    kv_offload: KVOffloadSpec | None = None
    """Keep the KV-cache blocks the GPUs evict in host memory, a second prefix-cache tier (unset: GPU memory only)."""


# ---------------------------------------------------------------- speculative decoding -----


class SpeculativeDecodingSpec(Model):
    """Speculative decoding: a drafter proposes tokens the target model verifies in one step."""

    model_config = validated_by(
        rule(
            "draft-model-required",
            "!(self.method in ['dspark', 'eagle3']) || has(self.draftModel)",
            "dspark and eagle3 need draftModel (e.g. Inferact/Kimi-K3-DSpark)",
            ".draftModel",
        ),
        rule(
            "speculative-tokens-required",
            "self.method == 'none' || has(self.numSpeculativeTokens)",
            "numSpeculativeTokens is required unless method is none",
            ".numSpeculativeTokens",
        ),
        rule(
            "adaptive-verification-dspark-only",
            "!has(self.adaptiveVerification) || !self.adaptiveVerification || self.method == 'dspark'",
            "adaptiveVerification exists only for dspark",
            ".adaptiveVerification",
        ),
        rule(
            "prompt-lookup-ngram-only",
            "self.method == 'ngram' || (!has(self.promptLookupMin) && !has(self.promptLookupMax))",
            "promptLookupMin/promptLookupMax apply to ngram only",
            ".method",
        ),
        rule(
            "prompt-lookup-min-le-max",
            "!has(self.promptLookupMin) || !has(self.promptLookupMax) || self.promptLookupMin <= self.promptLookupMax",
            "promptLookupMin must be <= promptLookupMax",
            ".promptLookupMin",
        ),
    )
    method: Literal["dspark", "eagle3", "mtp", "ngram", "none"] = "none"
    """dspark (block drafter, K3's fastest), eagle3, mtp, ngram (prompt lookup), or none."""
    draft_model: str | None = Field(default=None, max_length=256)
    """Drafter checkpoint for dspark/eagle3: Inferact/Kimi-K3-DSpark (7 tokens) or RedHatAI/Kimi-K3-speculator.dspark (8 tokens): a hub id (staged beside the target by a cache source), or the absolute path of its folder in the weights volume (below /models) when the engines run offline."""
    draft_revision: str | None = Field(default=None, max_length=128)
    """Hub revision (branch, tag or commit) of the drafter, staged and pinned on its own (unset: main)."""
    num_speculative_tokens: int | None = Field(default=None, ge=1, le=16)
    """Tokens drafted per step. The megakernel decode path takes at most 7."""
    draft_sample_method: Literal["greedy", "probabilistic"] | None = None
    """How the drafter samples (dspark recipes: probabilistic)."""
    rejection_sample_method: Literal["standard", "block"] | None = None
    """How the target accepts drafts (dspark recipes: block)."""
    adaptive_verification: bool = False
    """dspark only: verify a variable number of drafts per step (refused by the megakernel path)."""
    draft_tensor_parallel_size: int | None = Field(default=None, ge=1, le=64)
    """TP of the drafter: 1 or the target's TP."""
    prompt_lookup_min: int | None = Field(default=None, ge=1, le=64)
    """ngram only: shortest n-gram matched in the prompt."""
    prompt_lookup_max: int | None = Field(default=None, ge=1, le=64)
    """ngram only: longest n-gram matched in the prompt."""


# ---------------------------------------------------------------- topology ------------------

def _tp_expr(t: str) -> str:
    """CEL for the effective TP of topology ``t``: as set, else 8 for tp, 1 for dep, a node for tp-dp."""
    return (f"(has({t}.tensorParallelSize) ? {t}.tensorParallelSize : ({t}.strategy == 'tp' ? 8 : "
            f"({t}.strategy == 'dep' ? 1 : {GPUS_PER_NODE_CEL}[{t}.accelerator])))")


_TP = _tp_expr("self")
_TOPOLOGY_RULES = [
    rule(
        "tp-no-data-parallel",
        "self.strategy != 'tp' || !has(self.dataParallelSize) || self.dataParallelSize == 1",
        "strategy tp takes no dataParallelSize: use strategy tp-dp or dep",
        ".dataParallelSize",
    ),
    rule(
        "pipeline-parallel-tp-only",
        "self.strategy == 'tp' || !has(self.pipelineParallelSize) || self.pipelineParallelSize == 1",
        "pipeline parallelism is supported with strategy tp only",
        ".pipelineParallelSize",
    ),
    rule(
        "dep-tp-one",
        "self.strategy != 'dep' || !has(self.tensorParallelSize) || self.tensorParallelSize == 1",
        "strategy dep runs TP=1 per rank: set dataParallelSize to the group's GPUs",
        ".tensorParallelSize",
    ),
    rule(
        "data-parallel-required",
        "self.strategy == 'tp' || has(self.dataParallelSize)",
        "strategies dep and tp-dp need dataParallelSize",
        ".dataParallelSize",
    ),
    rule(
        "dep-whole-nodes",
        "self.strategy != 'dep' || self.dataParallelSize % "
        f"{GPUS_PER_NODE_CEL}[self.accelerator] == 0",
        "dep: dataParallelSize must be a multiple of the accelerator's GPUs per node (4 on gb300/gb200, 8 on b300/b200/h200)",
        ".dataParallelSize",
    ),
    rule(
        "tp-dp-tp-divides-node",
        "self.strategy != 'tp-dp' || "
        f"{GPUS_PER_NODE_CEL}[self.accelerator] % {_TP} == 0",
        "tp-dp: tensorParallelSize must divide the accelerator's GPUs per node (4 on gb300/gb200, 8 on b300/b200/h200)",
        ".tensorParallelSize",
    ),
    rule(
        "tp-dp-whole-nodes",
        "self.strategy != 'tp-dp' || self.dataParallelSize % "
        f"({GPUS_PER_NODE_CEL}[self.accelerator] / {_TP}) == 0",
        "tp-dp: dataParallelSize must be a multiple of the data-parallel ranks per node (GPUs per node / tensorParallelSize)",
        ".dataParallelSize",
    ),
    rule(
        "tp-fits-node-or-whole-nodes",
        f"self.strategy != 'tp' || ({_TP} * self.pipelineParallelSize) <= "
        f"{GPUS_PER_NODE_CEL}[self.accelerator] || "
        f"({_TP} * self.pipelineParallelSize) % {GPUS_PER_NODE_CEL}[self.accelerator] == 0",
        "tp: tensorParallelSize x pipelineParallelSize must fit one node or fill whole nodes",
        ".tensorParallelSize",
    ),
    rule(
        "tp-no-expert-parallel",
        "self.strategy != 'tp' || !has(self.expertParallel) || !self.expertParallel",
        "strategy tp has no expert parallelism: use strategy dep or tp-dp",
        ".expertParallel",
    ),
    rule(
        "group-within-rack",
        f"!(self.accelerator in {RACK_GPUS_CEL}) || (self.strategy == 'tp' ? {_TP} * self.pipelineParallelSize : "
        f"(has(self.dataParallelSize) ? self.dataParallelSize : 1) * (self.strategy == 'dep' ? 1 : {_TP})) <= "
        f"{RACK_GPUS_CEL}[self.accelerator]",
        "a group must stay inside one NVL72 rack (18 trays, 72 GPUs on gb300/gb200): use fewer GPUs per group",
    ),
]


class TopologySpec(Model):
    """The parallel shape of one engine group (one replica = one LeaderWorkerSet group).

    tp: one engine over tensorParallelSize x pipelineParallelSize GPUs, across trays.
    dep: wide expert parallelism, dataParallelSize ranks of TP=1 with --enable-expert-parallel.
    tp-dp: TP inside a node, data parallel across nodes (optionally with expert parallelism).
    """

    model_config = validated_by(*_TOPOLOGY_RULES)
    accelerator: Accelerator = "gb300"
    """GPU system: gb300/gb200 (4-GPU NVL72 trays), b300/b200/h200 (8-GPU nodes)."""
    strategy: Literal["tp", "dep", "tp-dp"] = "tp"
    """Parallel strategy: tp, dep (data + expert parallel), tp-dp."""
    tensor_parallel_size: int | None = Field(default=None, ge=1, le=72)
    """TP: with tp, GPUs of the engine (default 8 = 2 GB300 trays); with tp-dp, GPUs per DP rank (default: one node); with dep, 1."""
    pipeline_parallel_size: int = Field(default=1, ge=1, le=8)
    """PP stages (tp only). DSpark and the megakernel path need 1."""
    data_parallel_size: int | None = Field(default=None, ge=1, le=72)
    """DP ranks of the group (dep: the group's GPUs, e.g. 16 = 4 GB300 trays)."""
    expert_parallel: bool | None = None
    """--enable-expert-parallel. Always on with dep; optional with tp-dp; off with tp."""


# ---------------------------------------------------------------- autoscaling ---------------


LatencyMetric = Literal["timePerOutputToken", "interTokenLatency"]
"""Which decode latency: per output token (vLLM's ITL divided by the tokens per engine step) or
vLLM's raw inter-token latency (one observation per engine step)."""


class LatencyTarget(Model):
    """The decode-latency objective."""

    metric: LatencyMetric = "timePerOutputToken"
    """timePerOutputToken: per output token as users feel it (ITL / tokens per step under speculative decoding). interTokenLatency: vLLM's raw ITL histogram (one observation per engine step)."""
    percentile: int = Field(default=90, ge=50, le=99)
    """Percentile of the windowed histogram held under value."""
    value: Duration = "5ms"
    """Target, e.g. 5ms (~200 tokens/s per user)."""


class TTFTTarget(Model):
    """The time-to-first-token objective (vLLM's vllm:time_to_first_token_seconds), kept beside the decode one."""

    percentile: int = Field(default=90, ge=50, le=99)
    """Percentile of the windowed histogram held under value."""
    value: Duration
    """Target, e.g. 2s: what users wait for the first token of a long prompt."""


class MetricsSource(Model):
    """Where decode metrics are read."""

    type: Literal["prometheus", "podScrape"] = "prometheus"
    """prometheus: PromQL over HTTP; podScrape: the leader pods' /metrics."""
    prometheus_url: str | None = Field(default=None, pattern=PROMETHEUS_URL_PATTERN, max_length=512)
    """Prometheus base URL, e.g. http://prometheus-operated.monitoring:9090."""


class AutoscalingSpec(Model):
    """Replicas (groups) driven by measured decode latency."""

    model_config = validated_by(
        rule("autoscaling-min-le-max", "self.minReplicas <= self.maxReplicas", "minReplicas must be <= maxReplicas",
             ".minReplicas"),
        rule("ttft-target-positive", "!has(self.ttftTarget) || " + cel_not_duration("self.ttftTarget.value")
             + " || duration(self.ttftTarget.value) > duration('0s')",
             "ttftTarget.value must be above 0 (e.g. 2s)", ".ttftTarget.value"),
    )
    enabled: bool = False
    """When true the operator owns the LeaderWorkerSet's replicas."""
    min_replicas: int = Field(default=1, ge=0, le=64)
    """Fewest groups; 0 allows scale to zero when the whole scale-down window saw no traffic. At zero no engine reports load: wake the deployment by raising minReplicas (e.g. from a gateway or activator)."""
    max_replicas: int = Field(default=1, ge=1, le=64)
    """Most groups."""
    target: LatencyTarget = Field(default_factory=LatencyTarget)
    """Decode-latency objective."""
    ttft_target: TTFTTarget | None = None
    """Optional time-to-first-token objective; the autoscaler keeps both. Unset: decode latency only."""
    interval: Duration = "30s"
    """Time between decisions."""
    window: Duration = "2m"
    """Window of the histogram quantile."""
    scale_up_stabilization: Duration = "0s"
    """Highest recommendation over this window is used for scale-up."""
    scale_down_stabilization: Duration = "5m"
    """Scale down only if every recommendation over this window allowed it."""
    metrics_source: MetricsSource = Field(default_factory=MetricsSource)
    """Where metrics come from."""


class IdleSpec(Model):
    """Idle stop: the deployment's engine groups go after a time without requests; it wakes on an explicit request."""

    model_config = validated_by(
        rule("idle-stop-after-minimum", "!has(self.stopAfter) || " + cel_not_duration("self.stopAfter")
             + " || duration(self.stopAfter) >= duration('1m')",
             "idle.stopAfter must be at least 1m (e.g. 60m), or unset to never stop", ".stopAfter"),
    )
    stop_after: Duration | None = None
    """Stop after this long without a request (vLLM's request counters, read from autoscaling.metricsSource, show none running, waiting or finished): 0 groups, 0 GPUs held, the staged weights and caches kept. Wake with `kimik3 wake`, the inference.kimik3.io/wake-requested-at annotation, or a change of the spec (e.g. kubectl scale). Unset: never stop."""


# ---------------------------------------------------------------- scheduling etc. -----------


class Toleration(Model):
    """A pod toleration (core/v1 Toleration)."""

    key: str | None = Field(default=None, max_length=317)
    """Taint key; empty with operator Exists tolerates everything."""
    operator: Literal["Exists", "Equal"] = "Equal"
    """Exists or Equal."""
    value: str | None = Field(default=None, max_length=63)
    """Taint value for Equal."""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    """Taint effect to tolerate; empty means all."""
    toleration_seconds: int | None = Field(default=None, ge=0)
    """For NoExecute: seconds the pod stays bound after the taint appears."""


DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"


class PlacementSpec(Model):
    """How engine groups are placed into NVLink domains (racks).

    - ``exclusive`` (default; clusters without Kueue): LeaderWorkerSet's exclusive topology on
      ``topologyKey``, so each group of this deployment gets a whole rack (a TP8 group of GB300
      holds 2 of 18 trays and the rack's other 16 stay idle for this deployment).
    - ``kueue`` (Kueue v0.17.2 or later with topology-aware scheduling; v0.19.2 is the version
      tested, docs/dev-cluster.md says why no older one): the LeaderWorkerSet is submitted to
      the LocalQueue ``queueName``; Kueue admits each group whole (gang) within the tenant's GPU
      quota and packs it best-fit into one ``topologyKey`` domain with other groups (9 TP8 groups
      of GB300 fill one rack), and preempts by ``priorityClass``.

    Reserved and burst capacity (``burstPriorityClass``): the groups up to
    ``spec.autoscaling.minReplicas`` (every group when autoscaling is off) are reserved, admitted
    at ``priorityClass``; the groups above them are burst, admitted at ``burstPriorityClass``, a
    lower class that another tenant's reserved groups preempt first (``controller.capacity``).
    """

    model_config = validated_by(
        rule("placement-kueue-needs-queue", "self.mode != 'kueue' || has(self.queueName)",
             "mode kueue needs queueName (a LocalQueue of this namespace)", ".queueName"),
        rule("placement-exclusive-takes-no-kueue-settings",
             "self.mode == 'kueue' || !has(self.queueName) && !has(self.priorityClass) && !has(self.burstPriorityClass)",
             "queueName, priorityClass and burstPriorityClass apply to mode kueue only: set mode kueue, or remove them",
             ".mode"),
        rule("placement-burst-needs-priority-class",
             "!has(self.burstPriorityClass) || has(self.priorityClass) && self.burstPriorityClass != self.priorityClass",
             "burstPriorityClass needs priorityClass, another WorkloadPriorityClass of a higher value for the "
             "reserved groups (those up to autoscaling.minReplicas): set priorityClass to that class (not "
             "burstPriorityClass's), or remove burstPriorityClass", ".burstPriorityClass"),
    )
    mode: Literal["exclusive", "kueue"] = "exclusive"
    """exclusive: each group alone in one rack (LeaderWorkerSet exclusive topology); kueue: Kueue admits and packs groups."""
    queue_name: str | None = Field(default=None, min_length=1, max_length=63, pattern=DNS_LABEL_PATTERN)
    """The LocalQueue (in this namespace) the groups are submitted to; label kueue.x-k8s.io/queue-name. Kueue refuses a change while any group is Ready (v0.18+; always in v0.17)."""
    priority_class: str | None = Field(default=None, min_length=1, max_length=253)
    """A WorkloadPriorityClass (kueue.x-k8s.io/v1beta2) for the groups' Workloads: a higher one may preempt lower ones when quota or racks run out. With burstPriorityClass: the reserved groups' class."""
    burst_priority_class: str | None = Field(default=None, min_length=1, max_length=253)
    """A lower WorkloadPriorityClass for the burst groups (those above autoscaling.minReplicas): another tenant's reserved groups preempt them, never the reserved ones, when the ClusterQueues preempt LowerPriority only (docs/billing.md). Unset: every group at priorityClass."""


class SchedulingSpec(Model):
    """Where groups may run."""

    placement: PlacementSpec = Field(default_factory=PlacementSpec)
    """Exclusive racks per group (default) or Kueue placement (gang admission, packing, quota, priority)."""

    node_selector: dict[str, str] = Field(default_factory=dict)
    """Extra node labels every engine pod requires (the GPU product label is added by the operator)."""
    tolerations: list[Toleration] = Field(default_factory=list, max_length=32)
    """Tolerations of the engine pods (GPU nodes are often tainted)."""
    priority_class_name: str | None = Field(default=None, max_length=253)
    """PriorityClass of the engine pods."""
    scheduler_name: str | None = Field(default=None, max_length=253)
    """Scheduler (e.g. a gang scheduler) for the engine pods."""
    topology_key: str = Field(default="nvidia.com/gpu.clique", max_length=317)
    """Node label whose value bounds one NVLink domain; each multi-node group lands inside one value (alone in exclusive placement)."""


class GatewayParentRef(Model):
    """A Gateway (gateway.networking.k8s.io/v1) the HTTPRoute attaches to."""

    name: str = Field(min_length=1, max_length=253)
    """Gateway name."""
    namespace: str | None = Field(default=None, min_length=1, max_length=63)
    """Gateway namespace (default: the deployment's). Its listener's allowedRoutes must admit this namespace."""
    section_name: str | None = Field(default=None, min_length=1, max_length=253)
    """Listener of the Gateway to attach to (default: every listener that admits the route)."""


GATEWAY_HOSTNAME_PATTERN = r"^(\*\.)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"


class HTTPRouteSpec(Model):
    """An HTTPRoute (Gateway API v1) that exposes the client Service through a Gateway."""

    parent_refs: list[GatewayParentRef] = Field(min_length=1, max_length=8)
    """Gateways the route attaches to."""
    hostnames: list[Annotated[str, Field(pattern=GATEWAY_HOSTNAME_PATTERN, max_length=253)]] = Field(
        default_factory=list, max_length=16)
    """Host names the route answers (empty: every host name of the listener)."""
    path_prefixes: list[Annotated[str, Field(pattern=PATH_PREFIX_PATTERN, max_length=1024)]] = Field(
        default_factory=lambda: ["/v1"], min_length=1, max_length=16)
    """Path prefixes routed to the engines. Default /v1 only: vLLM checks the API key on /v1 but serves /health, /metrics, /tokenize, /pause and others without it."""


class ServiceSpec(Model):
    """The client Service in front of the group leaders."""

    type: Literal["ClusterIP", "NodePort", "LoadBalancer"] = "ClusterIP"
    """Service type."""
    port: int = Field(default=8000, ge=1, le=65535)
    """Port of the OpenAI-compatible API."""
    annotations: dict[str, str] = Field(default_factory=dict)
    """Annotations of the Service (e.g. for a cloud load balancer)."""
    api_key_secret: SecretKeyRef | None = None
    """Secret key holding the API key, passed to the API-serving pods as VLLM_API_KEY: vLLM then requires "Authorization: Bearer <key>" on /v1 (not on /health or /metrics)."""
    http_route: HTTPRouteSpec | None = None
    """Expose the API through a Gateway with an HTTPRoute (Gateway API CRDs and a Gateway needed)."""


class DisruptionBudgetSpec(Model):
    """A PodDisruptionBudget that counts whole groups: a group with one pod gone is down."""

    enabled: bool = True
    """Create the budget (skipped, with a Warning event, while it would block every drain: replicas <= 1)."""
    min_available: int | Annotated[str, Field(pattern=PERCENT_PATTERN)] = Field(
        default="75%",
        json_schema_extra={"x-kubernetes-validations": [rule(
            "min-available-count-or-percent",
            "type(self) == int ? self >= 0 : self.matches('^[0-9]{1,3}%$')",
            "a group count (>= 0) or a percentage such as 75%")]},
    )
    """Groups that must stay up during voluntary disruptions: a count, or a percentage of replicas (rounded up)."""


class MonitoringSpec(Model):
    """Prometheus scraping of the engines."""

    enabled: bool = True
    """Create a PodMonitor (prometheus-operator) for the API-serving pods."""
    interval: Duration = "15s"
    """Scrape interval."""
    labels: dict[str, str] = Field(default_factory=dict)
    """Labels of the PodMonitor (to match a Prometheus' podMonitorSelector)."""


DRAIN_LONGEST_OUTPUT_TOKENS = 32768
"""Output tokens of the longest generation the default ``probes.drainTimeout`` lets finish: a long
Kimi K3 answer with its thinking (clients that ask for more ``max_tokens`` should raise drainTimeout)."""
DRAIN_TIMEOUT_DEFAULT = (
    f"{math.ceil(DRAIN_LONGEST_OUTPUT_TOKENS * duration_seconds(LatencyTarget.model_fields['value'].default) / 60)}m")
"""``probes.drainTimeout`` by default: DRAIN_LONGEST_OUTPUT_TOKENS at the default per-token latency
target (``autoscaling.target.value``, 5 ms: 164 s), rounded up to whole minutes (3m); the rest
covers the request's prefill and its wait in the queue."""


class ProbesSpec(Model):
    """Start-up, health and shutdown of the engine."""

    load_timeout: Duration = "90m"
    """Longest a group may take to load weights and warm up before it counts as failed: the leader's startup probe budget and VLLM_ENGINE_READY_TIMEOUT_S. Kimi K3 loads ~1.5 TB: keep >= 60m."""
    leader_address_timeout: Duration = "30m"
    """Longest a worker waits for the leader's address to resolve (covers a slow image pull of the leader) before it exits non-zero."""
    period_seconds: int = Field(default=10, ge=1, le=300)
    """Probe period of the leader's /health probes."""
    liveness_failure_threshold: int = Field(default=6, ge=1, le=100)
    """Failed liveness probes (after start-up) before the leader restarts."""
    drain_timeout: Duration = DRAIN_TIMEOUT_DEFAULT
    """Longest the requests in flight on a group that goes (scale-down, a rollout retiring it, deletion) may take to finish: vLLM's --shutdown-timeout. Before it, the leader fails readiness so the Service and the endpoint picker stop sending to it. 0s: requests in flight are aborted at once (vLLM's default). Default 3m: 32,768 output tokens at 5 ms each."""


# ---------------------------------------------------------------- rollout -------------------


MIN_CHECKS_DEFAULT = 3
"""Passing canary checks needed before a promotion, by default: one is a single window, which a
burst or a lull can make look good; three windows (3 min at the default 1m interval) span more
than one scrape and one autoscaling window of the defaults (15s, 1m)."""


PROBE_REQUESTS_DEFAULT = 8
"""Requests the canary analysis sends per check to canary groups that get no traffic, by default:
8 of ``parity.maxTokens`` (32) tokens are ~256 output tokens a window, enough for a per-token
latency quantile from a handful of engine steps per request, and nothing next to a group's capacity."""


class CanaryAnalysis(Model):
    """What the canary groups must show, checked every ``interval`` over the bake, on the new
    revision's leaders only (its series carry the revision label apart from the old groups')."""

    max_latency: Duration | None = None
    """Highest per-token decode latency (autoscaling.target.metric) of the new revision at autoscaling.target.percentile. Unset: autoscaling.target.value."""
    max_error_rate: float = Field(default=0.01, ge=0.0, le=1.0)
    """Highest share of the new revision's finished requests that may end in error (vLLM's request_success_total by finished_reason)."""
    interval: Duration = "1m"
    """Time between checks; each check reads the window since the one before."""
    failure_limit: int = Field(default=3, ge=1, le=100)
    """Failed checks (over the whole bake, not only in a row) that roll the release back."""
    min_checks: int = Field(default=MIN_CHECKS_DEFAULT, ge=1, le=100)
    """Passing checks the new revision needs before it is promoted: the bake lasts at least ``bake`` and until it has them. A window without traffic or without a reading passes nothing. Default 3 (3 intervals of traffic judged)."""
    probe_requests: int = Field(default=PROBE_REQUESTS_DEFAULT, ge=0, le=64)
    """Once a check finds a window without traffic, the analysis sends this many requests of its own to the canary groups at every later check (greedy, parity.maxTokens output tokens each), so the windows have something to judge. 0: never."""


PARITY_MAX_MISMATCH_RATE_DEFAULT = 0.25
"""Share of golden prompts whose greedy outputs may differ between a canary group and an old
group before the release is rolled back, by default: two healthy groups of one revision differ on
~4% of the prompts in the simulator (its benign divergence of 2% per group,
``kimik3_dev.sim.divergence``; bench/results/parity.json), so 4 of the 16 default prompts may
differ before a release is judged corrupting."""
PARITY_MAX_TOKENS_DEFAULT = 32
"""Output tokens compared per golden prompt, by default: divergence from batch-variant kernels
grows with the length, corruption shows from its first token."""


class CanaryParity(Model):
    """Output parity: golden prompts sent at temperature 0 to a canary group and an old group, their greedy outputs compared token for token. Skipped when the model or drafter (or their revisions) change."""

    enabled: bool = True
    """Compare the outputs at every analysis check of the bake."""
    config_map: str | None = Field(default=None, min_length=1, max_length=253)
    """A ConfigMap of the namespace whose data values are the golden prompts (one prompt per key, sent in key order). Unset: the operator's shipped prompts."""
    max_tokens: int = Field(default=PARITY_MAX_TOKENS_DEFAULT, ge=1, le=1024)
    """Output tokens generated and compared per prompt."""
    max_mismatch_rate: float = Field(default=PARITY_MAX_MISMATCH_RATE_DEFAULT, ge=0.0, le=1.0)
    """Highest share of the prompts whose outputs may differ in one check (two healthy groups differ where kernels are not batch-invariant); above it the release is rolled back."""


class CanarySpec(Model):
    """Surge groups of the new revision bake beside every old group before any old group is replaced."""

    groups: int = Field(default=1, ge=1, le=64)
    """Groups of the new revision during the bake (surge groups: every old group keeps serving). At most maxSurge."""
    bake: Duration = "10m"
    """How long the canary groups serve, once Ready, before the rollout goes on."""
    analysis: CanaryAnalysis = Field(default_factory=CanaryAnalysis)
    """The checks; a release that fails failureLimit of them is rolled back."""
    parity: CanaryParity = Field(default_factory=CanaryParity)
    """Output parity with an old group at every check; a check over parity.maxMismatchRate rolls the release back."""


SURGE_DEFAULT = 1
"""Groups of the new revision created above replicas, by default, with strategy Surge."""
UNAVAILABLE_DEFAULT = 0
"""Groups that may be down at once, by default, with strategy Surge."""


class RolloutSpec(Model):
    """How a change of the engine groups' templates (model, engine, speculative decoding, topology) reaches the groups.

    Surge: new groups are created first (up to maxSurge beyond replicas, in a new LeaderWorkerSet)
    and an old group goes only once a new one is Ready, at most maxUnavailable down at once.
    Recreate: every group is replaced at once (the endpoint is down for a whole load).
    """

    model_config = validated_by(
        rule("rollout-surge-moves",
             "self.strategy != 'Surge' || (has(self.maxSurge) ? self.maxSurge : 1) + "
             "(has(self.maxUnavailable) ? self.maxUnavailable : 0) >= 1",
             "strategy Surge with maxSurge 0 and maxUnavailable 0 can never replace a group: raise one of them",
             ".maxSurge"),
        rule("rollout-recreate-plain",
             "self.strategy != 'Recreate' || (!has(self.maxSurge) && !has(self.maxUnavailable) && !has(self.canary))",
             "strategy Recreate replaces every group at once: it takes no maxSurge, maxUnavailable or canary",
             ".strategy"),
        rule("rollout-canary-within-surge",
             "!has(self.canary) || self.canary.groups <= (has(self.maxSurge) ? self.maxSurge : 1)",
             "canary.groups are surge groups beside every old group: raise maxSurge to at least canary.groups",
             ".canary.groups"),
    )
    strategy: Literal["Surge", "Recreate"] = "Surge"
    """Surge (new groups first, no group down by default) or Recreate (all groups at once)."""
    max_surge: int | None = Field(default=None, ge=0, le=64)
    """Surge only: groups of the new revision created above replicas while old ones still serve (default 1). Each needs room: a rack (exclusive) or Kueue quota."""
    max_unavailable: int | None = Field(default=None, ge=0, le=64)
    """Surge only: groups that may be down at once during a rollout (default 0: an old group goes only once a new one is Ready)."""
    canary: CanarySpec | None = None
    """Surge only: bake the new revision on canary groups and roll it back when its analysis fails."""
    progress_deadline: Duration | None = None
    """How long new-revision groups may take to turn Ready, counted from the last progress (a group of the new revision turned Ready, or more were asked for), before the release is rolled back (ProgressDeadlineExceeded), canary or not. Unset: probes.loadTimeout plus 10m (scheduling and an image pull). At least probes.loadTimeout."""
    paused: bool = False
    """Hold the rollout: no old group is replaced; a template change made while paused waits."""

    @property
    def surge(self) -> int:
        """maxSurge with its default (0 with Recreate)."""
        if self.strategy == "Recreate":
            return 0
        return SURGE_DEFAULT if self.max_surge is None else self.max_surge

    @property
    def unavailable(self) -> int | None:
        """maxUnavailable with its default; None with Recreate (every group)."""
        if self.strategy == "Recreate":
            return None
        return UNAVAILABLE_DEFAULT if self.max_unavailable is None else self.max_unavailable


# ---------------------------------------------------------------- spec ----------------------

_SPEC_RULES = [
    rule(
        "rollout-deadline-covers-load",
        "!has(self.rollout) || !has(self.rollout.progressDeadline) || "
        + cel_not_duration("self.rollout.progressDeadline") + " || (has(self.probes) && has(self.probes.loadTimeout) && "
        + cel_not_duration("self.probes.loadTimeout") + ") || duration(self.rollout.progressDeadline) >= "
        "duration(has(self.probes) && has(self.probes.loadTimeout) ? self.probes.loadTimeout : '90m')",
        "rollout.progressDeadline is shorter than probes.loadTimeout: a healthy group that takes its whole load "
        "budget would be rolled back; raise progressDeadline to at least loadTimeout, or leave it unset",
        ".rollout.progressDeadline",
    ),
    rule(
        "draft-tp-one-or-target",
        "!has(self.speculativeDecoding.draftTensorParallelSize) || self.speculativeDecoding.draftTensorParallelSize == 1 "
        f"|| self.speculativeDecoding.draftTensorParallelSize == {_tp_expr('self.topology')}",
        "draftTensorParallelSize must be 1 or the target's tensor parallel size",
        ".speculativeDecoding.draftTensorParallelSize",
    ),
    rule(
        "drafter-local-when-offline",
        "self.speculativeDecoding.method == 'none' || !has(self.speculativeDecoding.draftModel) || "
        "has(self.model.source.hub) || has(self.model.source.cache) || "
        "(self.speculativeDecoding.draftModel.startsWith('/models/') && !self.speculativeDecoding.draftModel.contains('..'))",
        "the engines run offline (HF_HUB_OFFLINE=1: weights from pvc or hostPath) and vLLM resolves no drafter "
        "named by hub id offline (F23): use model.source.cache, which stages the drafter beside the target, or give "
        "draftModel as the drafter's folder in the weights volume (below /models/)",
        ".speculativeDecoding.draftModel",
    ),
    rule(
        "dspark-no-pipeline-parallel",
        "self.speculativeDecoding.method != 'dspark' || self.topology.pipelineParallelSize == 1",
        "dspark does not work with pipeline parallelism (vllm#50098): set topology.pipelineParallelSize to 1",
        ".speculativeDecoding.method",
    ),
    rule(
        "megakernel-shape",
        "self.engine.decodeBackend != 'latency_specialized' || (self.topology.strategy == 'tp' && "
        f"{_tp_expr('self.topology')} in [8, 16] && self.topology.pipelineParallelSize == 1)",
        "the megakernel decode path (latency_specialized) needs strategy tp with tensorParallelSize 8 or 16 and no pipeline or expert parallelism: use decodeBackend stock",
        ".engine.decodeBackend",
    ),
    rule(
        "megakernel-gpu",
        f"self.engine.decodeBackend != 'latency_specialized' || self.topology.accelerator in {MEGAKERNEL_ACCELERATORS}",
        f"the megakernel decode path needs an SM100/SM103 GPU ({', '.join(MEGAKERNEL_ACCELERATORS)})",
        ".engine.decodeBackend",
    ),
    rule(
        "megakernel-speculative",
        "self.engine.decodeBackend != 'latency_specialized' || "
        "(self.speculativeDecoding.method in ['none', 'dspark'] && "
        "(!has(self.speculativeDecoding.numSpeculativeTokens) || self.speculativeDecoding.numSpeculativeTokens <= 7) && "
        "!self.speculativeDecoding.adaptiveVerification)",
        "the megakernel decode path takes speculative decoding none or dspark with at most 7 tokens and no adaptive verification",
        ".speculativeDecoding",
    ),
    rule(
        "megakernel-no-enforce-eager",
        "self.engine.decodeBackend != 'latency_specialized' || !self.engine.enforceEager",
        "the megakernel decode path needs full decode CUDA graphs: enforceEager must be false",
        ".engine.enforceEager",
    ),
    # The next three mirror vLLM 0.33.0's specialised-decode `unsupported` list (checked against
    # that code by tests/conformance; kimik3/admission/megakernel.py has their Python twins).
    rule(
        "megakernel-no-piecewise",
        "self.engine.decodeBackend != 'latency_specialized' || !has(self.engine.cudagraphMode) || "
        "self.engine.cudagraphMode != 'PIECEWISE'",
        "the megakernel decode path needs FULL decode CUDA graphs: cudagraphMode PIECEWISE is refused by vLLM",
        ".engine.cudagraphMode",
    ),
    rule(
        "megakernel-v2-runner",
        "self.engine.decodeBackend != 'latency_specialized' || !has(self.engine.env) || "
        "!self.engine.env.exists(e, e.name == 'VLLM_USE_V2_MODEL_RUNNER' && (has(e.value) ? e.value : '') != '1')",
        "the megakernel decode path runs on the V2 model runner: VLLM_USE_V2_MODEL_RUNNER must be 1 (or unset)",
        ".engine.env",
    ),
    rule(
        "megakernel-no-aux-stream",
        "self.engine.decodeBackend != 'latency_specialized' || self.speculativeDecoding.method == 'none' || "
        "!has(self.engine.env) || !self.engine.env.exists(e, e.name == 'VLLM_KIMI_K3_AUX_ATTN_RES_STREAM' && "
        "(has(e.value) ? e.value : '') != '0')",
        "the megakernel decode path refuses the AttnRes aux stream with speculative decoding: unset VLLM_KIMI_K3_AUX_ATTN_RES_STREAM",
        ".engine.env",
    ),
    rule(
        "weights-fit",
        f"(self.topology.strategy == 'tp' ? {_tp_expr('self.topology')} * self.topology.pipelineParallelSize : "
        "!has(self.topology.dataParallelSize) ? 0 : "
        "(self.topology.strategy == 'dep' || (has(self.topology.expertParallel) && self.topology.expertParallel)) ? "
        f"self.topology.dataParallelSize * {_tp_expr('self.topology')} : {_tp_expr('self.topology')}) * "
        f"{GPU_MEMORY_GB_CEL}[self.topology.accelerator] >= {MEMORY_FLOOR_GB_CEL}[self.model.variant]",
        "the GPUs holding one copy of the weights have too little memory for Kimi K3 (~1680 GB mxfp4, ~1650 GB nvfp4): use >= 8 gb300/b300 or >= 16 gb200/b200/h200 GPUs per model copy",
        ".topology",
    ),
    rule(
        "idle-prometheus-url-required",
        "!has(self.idle) || !has(self.idle.stopAfter) || self.autoscaling.metricsSource.type != 'prometheus' || "
        "has(self.autoscaling.metricsSource.prometheusUrl)",
        "idle.stopAfter reads requests from autoscaling.metricsSource: the prometheus source needs "
        "autoscaling.metricsSource.prometheusUrl (or set autoscaling.metricsSource.type: podScrape)",
        ".autoscaling.metricsSource.prometheusUrl",
    ),
    rule(
        "prometheus-url-required",
        "!self.autoscaling.enabled || self.autoscaling.metricsSource.type != 'prometheus' || "
        "has(self.autoscaling.metricsSource.prometheusUrl)",
        "autoscaling with the prometheus source needs autoscaling.metricsSource.prometheusUrl",
        ".autoscaling.metricsSource.prometheusUrl",
    ),
]

# ---------------------------------------------------------------- routing -------------------

ENDPOINT_PICKER_IMAGE = "registry.k8s.io/gateway-api-inference-extension/epp:v1.2.1"
"""The Gateway API Inference Extension's endpoint picker, v1.2.1: the last release whose ``cmd/epp``
holds the prefix-cache, KV-cache-utilization and queue scorers (later releases moved them out)."""


class EndpointPickerSpec(Model):
    """The endpoint picker (EPP) the gateway asks, over ext_proc, which group leader gets each request."""

    image: str = Field(default=ENDPOINT_PICKER_IMAGE, min_length=1, max_length=512)
    """Image of the picker; the default is the upstream v1.2.1 image whose flags and configuration the operator renders."""
    failure_mode: Literal["FailOpen", "FailClose"] = "FailOpen"
    """What the gateway does while the picker does not answer (InferencePool endpointPickerRef.failureMode). FailOpen (default): requests still go to some leader of the pool, chosen by the gateway without the picker's prefix and load scores, so a picker restart costs cache hits, not availability. FailClose: requests are refused (5xx) until the picker answers: choose it when a request that misses its cached prefix is worse than an error."""


class RoutingSpec(Model):
    """Prefix- and load-aware routing: an InferencePool (Gateway API Inference Extension v1) of the group leaders and its endpoint picker; the HTTPRoute (spec.service.httpRoute) then points at the pool instead of the Service."""

    enabled: bool = False
    """Render the InferencePool and the endpoint picker. On a cluster without the InferencePool CRD the deployment keeps the Service path and the RoutingReady condition says so."""
    endpoint_picker: EndpointPickerSpec = Field(default_factory=EndpointPickerSpec)
    """The picker's image and failure mode."""


class KimiK3DeploymentSpec(Model):
    """What to serve and how: model, engine, speculative decoding, topology, replicas."""

    model_config = validated_by(*_SPEC_RULES)
    model: ModelSpec
    """The model and where its weights come from."""
    engine: EngineSpec = Field(default_factory=EngineSpec)
    """The vLLM engine."""
    speculative_decoding: SpeculativeDecodingSpec = Field(default_factory=SpeculativeDecodingSpec)
    """Speculative decoding."""
    topology: TopologySpec = Field(default_factory=TopologySpec)
    """Parallel shape of one group; the operator derives nodes per group and placement."""
    replicas: int = Field(default=1, ge=0, le=64)
    """Engine groups (each a whole multi-node engine). Owned by the autoscaler when it is enabled."""
    autoscaling: AutoscalingSpec = Field(default_factory=AutoscalingSpec)
    """Decode-latency autoscaling."""
    idle: IdleSpec = Field(default_factory=IdleSpec)
    """Idle stop and wake."""
    scheduling: SchedulingSpec = Field(default_factory=SchedulingSpec)
    """Node selection and placement."""
    service: ServiceSpec = Field(default_factory=ServiceSpec)
    """Client Service."""
    disruption_budget: DisruptionBudgetSpec = Field(default_factory=DisruptionBudgetSpec)
    """Group-aware PodDisruptionBudget."""
    monitoring: MonitoringSpec = Field(default_factory=MonitoringSpec)
    """Prometheus scraping."""
    probes: ProbesSpec = Field(default_factory=ProbesSpec)
    """Start-up budget and health probes."""
    rollout: RolloutSpec = Field(default_factory=RolloutSpec)
    """How template changes reach the groups: surge (default), canary analysis, rollback, pause."""
    routing: RoutingSpec = Field(default_factory=RoutingSpec)
    """Requests routed by prefix and load through an InferencePool and its endpoint picker (off by default)."""


# ---------------------------------------------------------------- status --------------------


class Condition(Model):
    """A Kubernetes-style condition (metav1.Condition)."""

    type: str
    """Ready, Progressing, Degraded, ScalingLimited, or MetricsAvailable (with autoscaling)."""
    status: ConditionStatus
    """True, False or Unknown."""
    reason: str
    """CamelCase reason, e.g. AllGroupsReady, GroupsNotReady, Unschedulable, Measured."""
    # type and reason stay plain strings so that other writers' conditions are kept; the
    # operator's own types and reasons are kimik3.api.conditions.
    message: str = ""
    """Human-readable detail."""
    last_transition_time: str
    """RFC 3339 time the status last changed."""
    observed_generation: int | None = None
    """metadata.generation this condition was computed from."""


class DecodeStatus(Model):
    """Decode speed the autoscaler measured over its last window (spec.autoscaling.window)."""

    metric: LatencyMetric
    """What latencySeconds measures (spec.autoscaling.target.metric): timePerOutputToken (per output token: vLLM's ITL / tokens per engine step under speculative decoding) or interTokenLatency (vLLM's raw ITL, per engine step)."""
    percentile: int = Field(ge=50, le=99)
    """The percentile of the window's histogram latencySeconds is, e.g. 90 for P90 (spec.autoscaling.target.percentile)."""
    latency_seconds: float | None = None
    """The metric at the percentile over the window, seconds: what the autoscaler holds under spec.autoscaling.target.value. Unset when no token was decoded in the window."""
    above_top_bucket: bool | None = None
    """True when latencySeconds is only a lower bound: the percentile lies above the histogram's largest finite bucket bound, so the real figure is higher (failure case F21a)."""
    tokens_per_second_per_user: float | None = None
    """1 / time per output token at the same percentile (output tokens, whatever the metric)."""
    acceptance_length: float | None = None
    """Tokens per engine step: 1 + accepted / drafts (speculative decoding)."""
    ttft_seconds: float | None = None
    """Time to first token at ttftPercentile over the window, seconds: what the autoscaler holds under spec.autoscaling.ttftTarget.value. Unset when no first token came in the window."""
    ttft_percentile: int | None = Field(default=None, ge=50, le=99)
    """The percentile of ttftSeconds: spec.autoscaling.ttftTarget.percentile, else spec.autoscaling.target.percentile."""
    observed_at: str | None = None
    """RFC 3339 time of the measurement."""


class ScaleEvent(Model):
    """The last replica change the autoscaler made."""

    time: str
    """RFC 3339 time."""
    from_replicas: int = Field(alias="from")
    """Groups before."""
    to_replicas: int = Field(alias="to")
    """Groups after."""
    reason: str
    """Why."""


class IdleStatus(Model):
    """Idle stop (spec.idle.stopAfter): whether the deployment is stopped, since when, and its last wake."""

    stopped_at: str | None = None
    """RFC 3339 time the deployment stopped for want of requests; unset while it runs."""
    stopped_generation: int | None = None
    """metadata.generation when it stopped: a later spec change (e.g. kubectl scale) wakes it."""
    wake_estimate_seconds: float | None = Field(default=None, ge=0)
    """While stopped: seconds a wake takes to serve again, the load time measured on the groups that served before the stop (first pod created to last pod Ready, the figure the autoscaler uses); unset when none was measured."""
    woke_at: str | None = None
    """RFC 3339 time of the last wake; the idle clock counts from it."""


class PlanStatus(Model):
    """The topology the operator derived from the spec."""

    gpus_per_node: int
    """GPUs requested by each pod."""
    nodes_per_group: int
    """Pods (trays or nodes) per group: the LeaderWorkerSet size."""
    gpus_per_group: int
    """GPUs of one engine group."""
    compute_domain: bool
    """Whether a ComputeDomain joins each group's trays over NVLink (multi-tray NVL72 groups)."""
    compute_domain_note: str | None = None
    """Why no ComputeDomain exists although the shape needs one (an operator without the DRA driver)."""


class GroupStatus(Model):
    """One engine group (a LeaderWorkerSet group index): where it runs and, under placement kueue,
    what Kueue says about it."""

    leader_worker_set: str | None = None
    """The LeaderWorkerSet the group belongs to (a rollout runs an old and a new one side by side)."""
    index: int = Field(ge=0)
    """The group index (LeaderWorkerSet group-index label; Kueue's component-workload-index)."""
    rack: str | None = None
    """The NVLink domain (the trays' value of spec.scheduling.topologyKey) every bound pod of the group is in; unset before a pod is bound, when the operator cannot read nodes, and when the pods are in more than one (racks lists them)."""
    racks: list[str] = Field(default_factory=list)
    """Every NVLink domain the group's bound pods are in, each once, the leader's first; more than one: the group is split across racks, cannot run as one engine, is never counted Ready (ScalingLimited=True GroupSplitAcrossRacks)."""
    trays: list[str] = Field(default_factory=list)
    """Nodes the group's pods are bound to, leader first."""
    kueue: KueueState | None = None
    """Placement kueue: the state of the group's Workload (Admitted; Pending: waits for quota or a rack; Preempted: evicted for a higher-priority Workload, it comes back when room returns; Evicted: for another reason, e.g. NodeFailures)."""
    message: str | None = None
    """Why the group waits: Kueue's own message when not Admitted, else the scheduler's for an Unschedulable pod."""
    capacity: Literal["reserved", "burst"] | None = None
    """With placement.burstPriorityClass: reserved (index below autoscaling.minReplicas, admitted at priorityClass, never preempted for another tenant's burst) or burst (admitted at burstPriorityClass, preemptible)."""
    ready: bool = False
    """Every pod of the group exists and is Ready, and the group is inside one NVLink domain."""


class RevisionGroups(Model):
    """The groups of one revision of the group templates."""

    revision: str
    """The LeaderWorkerSet's revision (label leaderworkerset.sigs.k8s.io/template-revision-hash of the group's pods)."""
    groups: int
    """Groups whose leader runs this revision."""
    ready_groups: int
    """Of those, groups whose every pod is Ready."""


CheckResult = Literal["Passed", "Failed", "NoTraffic", "NoReading", "SourceUnreadable"]
"""What one canary check found (``controller.canary``)."""
CHECKS_KEPT = 10
"""Canary checks ``status.rollout.canary.history`` keeps (the newest; older ones are counted only)."""


class CanaryCheck(Model):
    """One check of the canary analysis, with what it measured."""

    time: str
    """RFC 3339 time of the check."""
    result: CheckResult
    """Passed / Failed against the limits; NoTraffic (no request in the window) and NoReading (the source has no window yet) judge nothing; SourceUnreadable (the metric source failed) pauses the rollout."""
    latency_seconds: float | None = None
    """Per-token latency of the new revision at the autoscaling percentile over the window."""
    error_rate: float | None = None
    """Share of the new revision's requests finished in the window that failed."""
    requests: float | None = None
    """Requests of the new revision finished in the window."""
    message: str = Field(default="", max_length=1024)
    """The figures against their limits, or why there are none."""


ParityResult = Literal["Passed", "Failed", "Skipped", "Unanswered"]
"""What one output-parity round found (``controller.parity``)."""


class ParityStatus(Model):
    """Output parity of the canary with an old group (spec.rollout.canary.parity), as of the last round."""

    result: ParityResult
    """Passed / Failed against maxMismatchRate; Skipped: parity cannot hold for this change (the model or drafter changed, an API key the operator does not hold, parity off), the message says why; Unanswered: a group did not answer the prompts (retried at the next check)."""
    rounds: int = 0
    """Rounds compared over the bake (one per analysis check)."""
    passed_rounds: int = 0
    """Of those, rounds within maxMismatchRate: a canary under parity is promoted only after one."""
    prompts: int = 0
    """Golden prompts compared in the last round."""
    mismatches: int = 0
    """Of those, prompts whose greedy outputs differ."""
    mismatch_rate: float | None = None
    """mismatches / prompts."""
    max_mismatch_rate: float | None = None
    """The threshold it was held to."""
    message: str = Field(default="", max_length=1024)
    """The figures, the first diverging prompt and token, or why parity was skipped."""


class CanaryStatus(Model):
    """The canary of one template change (spec.rollout.canary)."""

    template_hash: str
    """The rendered group templates this canary bakes (the LeaderWorkerSet annotation inference.kimik3.io/template-hash)."""
    revision: str | None = None
    """The LeaderWorkerSet revision of the canary groups, once they exist."""
    ready_since: str | None = None
    """RFC 3339 time every canary group was first Ready: the bake runs from here."""
    checks: int = 0
    """Analysis checks that judged the new revision (a window with traffic and a reading)."""
    failed_checks: int = 0
    """Of those, checks the new revision failed; the others passed."""
    latency_seconds: float | None = None
    """Per-token latency of the new revision at the autoscaling percentile in the last check."""
    error_rate: float | None = None
    """Share of the new revision's finished requests that failed in the last check."""
    last_check: str | None = None
    """RFC 3339 time of the last check."""
    message: str = ""
    """What the last check found."""
    history: list[CanaryCheck] = Field(default_factory=list, max_length=CHECKS_KEPT)
    """The last checks, oldest first, each with its figures (at most 10)."""
    promoted: bool = False
    """The bake passed: the rollout goes on to every group."""
    parity: ParityStatus | None = None
    """Output parity of the canary with an old group, once a round ran."""
    probing: bool = False
    """A window had no traffic: every later check sends analysis.probeRequests probe requests to the canary groups."""
    probe_requests: int = 0
    """Probe requests sent to the canary groups so far (also kimik3_canary_probe_requests_total)."""


class RollbackStatus(Model):
    """A release rolled back: by its failed canary analysis, or at its progress deadline."""

    template_hash: str
    """The rendered group templates that failed: while the spec still renders them, the previous templates stay."""
    revision: str | None = None
    """Its LeaderWorkerSet revision."""
    restored_revision: str | None = None
    """The revision restored."""
    time: str
    """RFC 3339 time of the rollback."""
    reason: str = Field(default="RolledBack", max_length=64)
    """RolledBack: the canary failed its analysis; ProgressDeadlineExceeded: its groups were not Ready within rollout.progressDeadline."""
    message: str
    """Why, with the measured figures or what the groups waited on."""


class ProgressStatus(Model):
    """The last progress of the new revision's groups: rollout.progressDeadline counts from it."""

    template_hash: str
    """The rendered group templates rolling out."""
    groups: int
    """Groups of the new templates asked for then (their LeaderWorkerSet's replicas)."""
    ready_groups: int
    """Of those, groups Ready then."""
    since: str
    """RFC 3339 time of the last progress: a group of the new templates turned Ready, or more were asked for."""


class RolloutStatus(Model):
    """Where a change of the group templates stands (spec.rollout)."""

    current_revision: str | None = None
    """The revision the groups ran before the rollout (all of them once it is done)."""
    update_revision: str | None = None
    """The revision being rolled out (unset until the LeaderWorkerSet has created a group of it)."""
    updated_replicas: int = 0
    """Groups on the update revision, surge groups included."""
    updated_ready_replicas: int = 0
    """Of those, groups whose every pod is Ready: old groups never count here."""
    revisions: list[RevisionGroups] = Field(default_factory=list)
    """Groups per revision, the update revision first."""
    canary: CanaryStatus | None = None
    """The canary of the current template change (spec.rollout.canary)."""
    rolled_back: RollbackStatus | None = None
    """The last release rolled back, while the spec still asks for it."""
    progress: ProgressStatus | None = None
    """While a rollout runs: its last progress (rollout.progressDeadline counts from it)."""


class EngineOverride(Model):
    """A setting vLLM 0.33 changes or narrows without an error, for this spec (``kimik3.engine.overrides``)."""

    fields: list[str]
    """The spec fields concerned, as paths (spec.engine.maxNumSeqs, ...)."""
    vllm_uses: str
    """What vLLM will run with instead, in vLLM's own terms (e.g. max_num_active_seqs 585)."""
    message: str
    """What is asked and what vLLM does instead, with the figures."""
    avoid: str
    """The change to the spec that avoids it."""

class PoolParentRef(Model):
    """A Gateway an InferencePool is attached to (the InferencePool's status.parents[].parentRef)."""

    group: str | None = None
    kind: str | None = None
    name: str
    namespace: str | None = None


class PoolParentStatus(Model):
    """What one gateway says of the InferencePool (mirrored from its status.parents)."""

    parent_ref: PoolParentRef
    """The Gateway."""
    controller_name: str | None = None
    """The gateway controller that wrote this entry."""
    conditions: list[Condition] = Field(default_factory=list)
    """Accepted, ResolvedRefs, ... as that gateway wrote them."""


class RoutingStatus(Model):
    """Where requests go (spec.routing.enabled)."""

    backend: Literal["InferencePool", "Service"]
    """What the HTTPRoute sends traffic to: the InferencePool, or the Service when the cluster does not serve the InferencePool kind."""
    inference_pool: str | None = None
    """The InferencePool (named like the deployment); unset on the Service path."""
    endpoint_picker: str | None = None
    """The picker's Deployment and Service; unset on the Service path."""
    parents: list[PoolParentStatus] = Field(default_factory=list)
    """The InferencePool's status.parents: each gateway that took the pool, with its conditions."""


class KimiK3DeploymentStatus(Model):
    """What the operator observed."""

    observed_generation: int | None = None
    """metadata.generation of the spec the status describes."""
    conditions: list[Condition] = Field(default_factory=list)
    """Ready, Progressing, Degraded, MetricsAvailable, ScalingLimited."""
    replicas: int | None = None
    """Groups that exist (LeaderWorkerSet status.replicas)."""
    ready_replicas: int | None = None
    """Groups whose every pod is ready."""
    desired_replicas: int | None = None
    """Groups the autoscaler wants."""
    selector: str | None = None
    """Label selector of the group leaders (scale subresource)."""
    endpoint: str | None = None
    """In-cluster URL of the OpenAI-compatible API."""
    plan: PlanStatus | None = None
    """Derived topology."""
    decode: DecodeStatus | None = None
    """Measured decode speed."""
    last_scale: ScaleEvent | None = None
    """Last autoscaling decision that changed replicas."""
    idle: IdleStatus | None = None
    """Idle stop and wake (spec.idle.stopAfter); the condition Stopped says the same."""
    groups: list[GroupStatus] | None = None
    """Each group once: its rack, trays, Kueue state with Kueue's message, and readiness (conditions only point here)."""
    rollout: RolloutStatus | None = None
    """Revisions of the groups and how far a rollout is."""
    routing: RoutingStatus | None = None
    """With spec.routing.enabled: the backend the route uses and what the gateways say of the InferencePool."""
    engine_overrides: list[EngineOverride] | None = None
    """Settings vLLM 0.33 will change or narrow without an error for the admitted spec (also Warning Events EngineSettingOverridden and `kimik3 validate`): each with its fields, the value vLLM uses and the change that avoids it; empty when none."""

    def condition(self, type_: str) -> Condition | None:
        """The condition of this type, or None."""
        return next((c for c in self.conditions if c.type == type_), None)


PATTERN_MEANINGS: dict[str, str] = {
    DURATION_PATTERN: "a duration: numbers with units ms, s, m or h, e.g. 500ms, 90s, 60m or 1h30m",
    SIZE_PATTERN: "a size in whole Gi or Ti, e.g. 200Gi or 2Ti",
    SHM_SIZE_PATTERN: "a size in whole Mi or Gi, e.g. 200Gi",
    CPU_PATTERN: "a CPU quantity: cores or millicores, e.g. 16 or 500m",
    MEMORY_PATTERN: "a memory quantity: bytes, or whole Ki, Mi, Gi or Ti, e.g. 800Gi",
    PERCENT_PATTERN: "a percentage, e.g. 50%",
    ABSOLUTE_PATH_PATTERN: "an absolute path, starting with /",
    PATH_PREFIX_PATTERN: "a path prefix starting with /, e.g. /v1",
    HUB_URL_PATTERN: "an http:// or https:// URL without spaces, e.g. https://hf-mirror.example.com",
    PROMETHEUS_URL_PATTERN: "an http:// or https:// URL, e.g. http://prometheus-operated.monitoring:9090",
    ENV_NAME_PATTERN: "an environment variable name: letters, digits and _, not starting with a digit",
    DNS_LABEL_PATTERN: "a DNS label: lowercase letters, digits and '-', starting and ending with a letter or digit",
    GATEWAY_HOSTNAME_PATTERN: "a lowercase host name, optionally starting with '*.', e.g. acme.inference.example.com",
}
"""What a string of each pattern of the spec is, with examples: ``kimik3 validate`` says this where
pydantic would quote the regular expression (``api.errors.from_validation_error``)."""
