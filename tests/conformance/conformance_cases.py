"""Specs to check against vLLM, and what each rank's parsed arguments must hold.

``recipe_cases()`` reads recipes/; ``generated_cases()`` draws a broad, deterministic set of specs
over every strategy, accelerator profile, speculative method, decode backend, MoE and all-to-all
backend, KV-cache dtype and more, keeping those admission accepts.

The oracle does not rebuild the command line the way ``kimik3.engine.args`` does. It holds vLLM's
parse to facts stated here as values, each from the API guide or vLLM's documentation:
``field_expectations`` maps every typed field to the vLLM setting it names (``FIELDS``,
``SPECULATIVE_KEYS``, ``MODEL_MOUNT``); ``layout_problems`` checks the parallel layout by what a
working group needs (every GPU of every node it spans used, node and data-parallel ranks that tile
the group, one leader, the rest headless), from the GPUs per node of ``GPUS_PER_NODE`` and the
backend table ``ALL2ALL_WHEN_UNSET``; ``STATED_LAYOUTS`` writes out whole groups rank by rank.
``problems(case, results)`` names the flag of every difference, so a wrong flag or value in a
builder fails with the flag in the message.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass, field
from typing import Any

from kimik3.admission import Seconds, admit
from kimik3.api.errors import SpecErrors
from kimik3.api.v1alpha1 import KimiK3DeploymentSpec
from kimik3.engine.args import LEADER_ADDRESS, engine_env, rank_args
from kimik3.topology.plan import GroupPlan
from support.recipes import RECIPE_FILES, documents

ADDRESS = "k3-0.k3.inference.svc.cluster.local"
"""What the launcher puts in place of the leader placeholder (an LWS leader DNS name)."""
ITL_BUCKETS = [0.001, 0.002, 0.003, 0.004, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.1]

GPUS_PER_NODE = {"gb300": 4, "gb200": 4, "b300": 8, "b200": 8, "h200": 8}
"""GPUs of one node (a GB300/GB200 NVL72 compute tray holds 4, a B300/B200/H200 HGX board 8)."""
ACCELERATORS = list(GPUS_PER_NODE)
METHODS = ["dspark", "eagle3", "mtp", "ngram", "none"]
MOE_BACKENDS = [None, "auto", "flashinfer_trtllm", "deep_gemm_mega_moe", "flashinfer_cutlass", "triton"]
ALL2ALL = [None, "flashinfer_nvlink_one_sided", "flashinfer_nvlink_two_sided", "deepep_v2", "deepep_low_latency",
           "deepep_high_throughput", "allgather_reducescatter", "naive"]
KV_DTYPES = ["auto", "fp8", "fp8_e4m3", "fp8_e5m2", "bfloat16"]
EXTRA_ARGS = [
    [], [], [], ["--custom-histogram-buckets", json.dumps({"inter_token_latency": ITL_BUCKETS})],
    ["--max-logprobs", "5"], ["--kda-decode-backend", "triton"], ["--enable-lora"], ["--enable-sleep-mode"],
    ["--enable-dbo"], ["--decode-context-parallel-size", "2"], ["--mamba-cache-dtype", "float32"],
    ["--mamba-ssm-cache-dtype", "bfloat16"], ["--use-replayssm"], ["-O0"], ["-O1"], ["-O3"],
]
ENVS = [[], [], [], [{"name": "VLLM_USE_V2_MODEL_RUNNER", "value": "0"}],
        [{"name": "VLLM_KIMI_K3_AUX_ATTN_RES_STREAM", "value": "1"}], [{"name": "NCCL_DEBUG", "value": "WARN"}]]


@dataclass
class Case:
    name: str
    raw: dict[str, Any]
    spec: KimiK3DeploymentSpec
    plan: GroupPlan
    argvs: list[list[str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.argvs:
            self.argvs = [[a.replace(LEADER_ADDRESS, ADDRESS) for a in rank_args(self.spec, self.plan, r)]
                          for r in range(self.plan.nodes_per_group)]

    @property
    def env(self) -> dict[str, str]:
        return engine_env(self.spec, self.plan, Seconds.of(self.spec).load_timeout)

    @property
    def sm100_family(self) -> bool:
        """What vLLM's is_device_capability_family(100) answers on this accelerator's GPUs."""
        return self.spec.topology.accelerator in ("gb300", "gb200", "b300", "b200")


def make_case(name: str, raw: dict[str, Any]) -> Case:
    admitted = admit(raw)
    spec, plan = admitted.spec, admitted.plan
    return Case(name, raw, spec, plan)


def recipe_cases() -> list[Case]:
    cases = []
    for path in RECIPE_FILES:
        for doc in documents(path):
            if doc.get("kind") == "KimiK3Deployment":
                cases.append(make_case(f"{path.name}:{doc['metadata']['name']}", doc["spec"]))
    return cases


def _draw(rng: random.Random) -> dict[str, Any]:
    acc = rng.choice(ACCELERATORS)
    g = GPUS_PER_NODE[acc]
    strategy = rng.choice(["tp", "tp", "dep", "tp-dp", "tp-dp"])
    topo: dict[str, Any] = {"accelerator": acc, "strategy": strategy}
    if strategy == "tp":
        topo["tensorParallelSize"] = rng.choice([8, 8, 16, 16, 32, 4])
        topo["pipelineParallelSize"] = rng.choice([1, 1, 1, 2])
    elif strategy == "dep":
        topo["dataParallelSize"] = rng.choice([8, 16, 16, 32, 64, 12])
    else:
        tp = rng.choice([1, 2, 4, 8])
        topo["tensorParallelSize"] = tp
        topo["dataParallelSize"] = rng.choice([g // tp if g % tp == 0 else 1, 2, 4, 8, 16, 32])
        topo["expertParallel"] = rng.random() < 0.7
    method = rng.choice(METHODS)
    sd: dict[str, Any] = {"method": method}
    if method != "none":
        sd["numSpeculativeTokens"] = rng.choice([1, 3, 5, 7, 7, 8, 10, 16])
    if method == "dspark":
        sd["draftModel"] = rng.choice(["Inferact/Kimi-K3-DSpark", "RedHatAI/Kimi-K3-speculator.dspark"])
        if rng.random() < 0.5:
            sd["draftSampleMethod"], sd["rejectionSampleMethod"] = "probabilistic", "block"
        sd["adaptiveVerification"] = rng.random() < 0.2
    elif method == "eagle3":
        sd["draftModel"] = "nvidia/Kimi-K3-Eagle3"
        if rng.random() < 0.5:
            sd["draftSampleMethod"] = rng.choice(["greedy", "probabilistic"])
    elif method == "ngram":
        lo, hi = rng.choice([(None, None), (2, 4), (None, 10), (3, None), (1, 64)])
        if lo is not None:
            sd["promptLookupMin"] = lo
        if hi is not None:
            sd["promptLookupMax"] = hi
    if method in ("dspark", "eagle3", "mtp") and rng.random() < 0.3:
        sd["draftTensorParallelSize"] = rng.choice([1, topo.get("tensorParallelSize", 1), 2])
    engine: dict[str, Any] = {
        "decodeBackend": rng.choice(["latency_specialized", "stock", "stock"]),
        "kvCacheDtype": rng.choice(KV_DTYPES),
        "gpuMemoryUtilization": rng.choice([0.5, 0.85, 0.9, 0.93, 0.98]),
        "maxNumSeqs": rng.choice([1, 16, 64, 256, 1024]),
        "maxNumBatchedTokens": rng.choice([256, 8192, 16384]),
        "extraArgs": rng.choice(EXTRA_ARGS),
        "env": rng.choice(ENVS),
    }
    for key, pool in (("moeBackend", MOE_BACKENDS), ("all2allBackend", ALL2ALL),
                      ("loadFormat", [None, "auto", "safetensors", "fastsafetensors", "runai_streamer"]),
                      ("cudagraphMode", [None, "FULL_AND_PIECEWISE", "FULL_DECODE_ONLY", "FULL", "PIECEWISE"])):
        value = rng.choice(pool)
        if value is not None:
            engine[key] = value
    engine["enforceEager"] = rng.random() < 0.1
    if rng.random() < 0.25:
        engine["kvOffload"] = {"size": rng.choice(["64Gi", "350Gi", "1Ti"])}
    source = rng.choice([{"pvc": {"claimName": "w"}}, {"pvc": {"claimName": "w", "subPath": "k3/mxfp4"}},
                         {"hostPath": {"path": "/data/k3"}}, {"hub": {}},
                         {"cache": {"claimName": "w", "declaredReady": True}}])
    model: dict[str, Any] = {"source": source, "variant": rng.choice(["mxfp4", "nvfp4"]),
                             "servedModelName": rng.choice(["kimi-k3", "k3-fast"]),
                             "features": {k: rng.random() < 0.7 for k in
                                          ("toolCalling", "reasoningParser", "prefixCaching", "languageModelOnly")}}
    if rng.random() < 0.3:
        model["revision"] = "main"
    if rng.random() < 0.4:
        model["maxModelLen"] = rng.choice([8192, 262144, 1048576])
    return {"model": model, "engine": engine, "speculativeDecoding": sd, "topology": topo,
            "service": {"port": rng.choice([8000, 8080])}}


def generated_cases(n_valid: int = 400, seed: int = 5, max_draws: int = 20000) -> tuple[list[Case], int]:
    """``n_valid`` admitted specs (deterministic), and how many draws admission refused."""
    rng = random.Random(seed)
    cases: list[Case] = []
    seen: set[str] = set()
    refused = 0
    for i in range(max_draws):
        raw = _draw(rng)
        key = json.dumps(raw, sort_keys=True)
        if key in seen:
            continue
        seen.add(key)
        try:
            cases.append(make_case(f"generated-{i}", raw))
        except SpecErrors:
            refused += 1
            continue
        if len(cases) >= n_valid:
            break
    return cases, refused


# ---------------------------------------------------------------- the oracle ---------------------

MODEL_MOUNT = "/models"
"""Where an engine pod mounts the weights of a ``pvc``, ``hostPath`` or ``cache`` source (API guide);
a PVC's ``subPath`` is a folder below it, a cache holds ``<repo id>/<revision>`` folders. A ``hub``
source is served by its model id."""

SPECULATIVE_KEYS = {
    "method": "method", "numSpeculativeTokens": "num_speculative_tokens", "draftModel": "model",
    "draftSampleMethod": "draft_sample_method", "rejectionSampleMethod": "rejection_sample_method",
    "draftTensorParallelSize": "draft_tensor_parallel_size", "promptLookupMin": "prompt_lookup_min",
    "promptLookupMax": "prompt_lookup_max", "adaptiveVerification": "enable_adaptive_verification",
}
"""Each field of spec.speculativeDecoding and the key of vLLM's SpeculativeConfig it sets (a field
left out, or false, leaves vLLM's default)."""

ALL2ALL_WHEN_UNSET = {"gb300": "flashinfer_nvlink_one_sided", "gb200": "flashinfer_nvlink_one_sided",
                      "b300": "deepep_v2", "b200": "deepep_v2", "h200": "deepep_v2"}
"""The all-to-all backend of an expert-parallel group whose spec sets none: NVLink one-sided where
the whole rack is one NVLink domain (NVL72), DeepEP v2 over the network elsewhere
(kimi-k3-and-vllm.md). With ``moeBackend: deep_gemm_mega_moe`` vLLM's default stays (that kernel
does its own dispatch)."""

DEFAULT = object()
"""In STATED_LAYOUTS: vLLM's own default for the field (what a bare ``vllm serve /models`` parses)."""


def _staged(repo_id: str, revision: str | None) -> str:
    """Where a ``cache`` source holds a repository: ``/models/<repo id>/<revision, default main>``."""
    return f"{MODEL_MOUNT}/{repo_id}/{revision or 'main'}"


def _model_path(raw: dict[str, Any], model_id: str) -> str:
    source = raw["model"]["source"]
    if "cache" in source:
        return _staged(model_id, raw["model"].get("revision"))
    if "pvc" in source:
        sub = (source["pvc"].get("subPath") or "").strip("/")
        return f"{MODEL_MOUNT}/{sub}" if sub else MODEL_MOUNT
    return MODEL_MOUNT if "hostPath" in source else model_id


def expected_speculative_config(case: Case) -> dict[str, Any] | None:
    """The --speculative-config vLLM must hold: the spec's own fields (``case.raw``), renamed by
    ``SPECULATIVE_KEYS``, with the API's defaults for method and numSpeculativeTokens."""
    sd = case.spec.speculative_decoding
    if sd.method == "none":
        return None
    raw = case.raw.get("speculativeDecoding") or {}
    out = {SPECULATIVE_KEYS[k]: v for k, v in raw.items() if v is not None and v is not False}
    if "cache" in case.raw["model"]["source"] and "model" in out:  # staged beside the target (F23)
        out["model"] = _staged(out["model"], None)
    return out | {"method": sd.method, "num_speculative_tokens": sd.num_speculative_tokens}


def field_expectations(case: Case, defaults: dict[str, Any]) -> dict[str, tuple[str, Any]]:
    """{parsed field: (flag, value)} every rank's parse must hold for the typed fields of the spec
    (values as the API defaults them). ``defaults`` is vLLM's parse of a bare ``vllm serve
    /models`` (what an unset field means)."""
    spec = case.spec
    e, m, f, d = spec.engine, spec.model, spec.model.features, defaults
    out: dict[str, tuple[str, Any]] = {
        "model": ("<model>", _model_path(case.raw, m.name)),
        "served_model_name": ("--served-model-name", [m.served_model_name]),
        "trust_remote_code": ("--trust-remote-code", True),
        "port": ("--port", spec.service.port),
        "revision": ("--revision", None if m.source.cache is not None else m.revision),
        "max_model_len": ("--max-model-len", m.max_model_len),
        "kv_cache_dtype": ("--kv-cache-dtype", e.kv_cache_dtype),
        "gpu_memory_utilization": ("--gpu-memory-utilization", e.gpu_memory_utilization),
        "max_num_seqs": ("--max-num-seqs", e.max_num_seqs),
        "max_num_batched_tokens": ("--max-num-batched-tokens", e.max_num_batched_tokens),
        "moe_backend": ("--moe-backend", e.moe_backend or d["moe_backend"]),
        "load_format": ("--load-format", e.load_format or d["load_format"]),
        "enforce_eager": ("--enforce-eager", e.enforce_eager),
        "compilation_config.cudagraph_mode": ("--compilation-config", e.cudagraph_mode),
        "additional_config": ("--additional-config", {"decode_backend": "latency_specialized"}
                              if e.decode_backend == "latency_specialized" else d["additional_config"]),
        "enable_auto_tool_choice": ("--enable-auto-tool-choice", f.tool_calling),
        "tool_call_parser": ("--tool-call-parser", "kimi_k3" if f.tool_calling else d["tool_call_parser"]),
        "reasoning_parser": ("--reasoning-parser", "kimi_k3" if f.reasoning_parser else d["reasoning_parser"]),
        "enable_prefix_caching": ("--enable-prefix-caching", f.prefix_caching),
        "language_model_only": ("--language-model-only", f.language_model_only),
        "speculative_config": ("--speculative-config", expected_speculative_config(case)),
        # vLLM 0.33's CacheConfig: the host tier in GiB, over all ranks of an engine, and its backend
        "kv_offloading_size": ("--kv-offloading-size", None if e.kv_offload is None else
                               float(int(e.kv_offload.size[:-2]) * (1024 if e.kv_offload.size.endswith("Ti") else 1))),
        "kv_offloading_backend": ("--kv-offloading-backend", d["kv_offloading_backend"] if e.kv_offload is None
                                  else e.kv_offload.backend),
        # vLLM 0.33's VllmConfig.shutdown_timeout (whole seconds): the drain of probes.drainTimeout
        "shutdown_timeout": ("--shutdown-timeout", math.ceil(Seconds.of(spec).drain_timeout)),
    }
    if "--custom-histogram-buckets" in e.extra_args:
        out["custom_histogram_buckets"] = ("--custom-histogram-buckets", {"inter_token_latency": ITL_BUCKETS})
    return out


LAYOUT_FLAGS = {
    "tensor_parallel_size": "--tensor-parallel-size", "pipeline_parallel_size": "--pipeline-parallel-size",
    "data_parallel_size": "--data-parallel-size", "data_parallel_size_local": "--data-parallel-size-local",
    "data_parallel_start_rank": "--data-parallel-start-rank", "data_parallel_address": "--data-parallel-address",
    "data_parallel_rpc_port": "--data-parallel-rpc-port", "nnodes": "--nnodes", "node_rank": "--node-rank",
    "master_addr": "--master-addr", "master_port": "--master-port", "headless": "--headless",
    "enable_expert_parallel": "--enable-expert-parallel", "all2all_backend": "--all2all-backend",
}
"""The parsed fields of the parallel layout and the flag that sets each (named in a problem)."""


def layout_problems(case: Case, results: list[dict[str, Any]], defaults: dict[str, Any],
                    version: str) -> list[str]:
    """How vLLM's parse of the group's ranks (``results``, rank order) fails to make the group the
    spec asks for. What a working group needs, whatever builds its command lines:

    - the sizes the spec names (API defaults: TP 8 with ``tp``, one node per data-parallel rank's
      TP with ``tp-dp``, TP 1 with ``dep``);
    - every GPU of every node it spans used, one node holding a group that fits in it;
    - ``tp``: node ranks 0..n-1 in rank order, all to the leader's address and one port;
    - ``dep``/``tp-dp``: equal local data-parallel sizes that add up to the data-parallel size,
      each rank starting where the ranks before it end (the leader's 0 implied), one coordinator
      address and RPC port; expert parallelism as the strategy says, with ``ALL2ALL_WHEN_UNSET``;
    - the leader serves the API, every other rank is headless; a one-node group none of it.
    """
    spec, raw, d = case.spec, case.raw.get("topology") or {}, defaults
    topo, e = spec.topology, spec.engine
    g = GPUS_PER_NODE[topo.accelerator]
    n = len(results)
    multi = n > 1
    got = [{**r["args"], **r["engine"]} for r in results]
    want: list[dict[str, Any]] = [{} for _ in results]
    out: list[str] = []

    def differs(rank: int, key: str, value: Any, why: str) -> None:
        if not _same(got[rank].get(key), value):
            out.append(f"{case.name} rank {rank}: {LAYOUT_FLAGS[key]}: vLLM {version} parsed {key}="
                       f"{got[rank].get(key)!r}, the group needs {value!r} ({why})")

    def everywhere(key: str, value: Any, why: str) -> None:
        for rank in range(n):
            differs(rank, key, value, why)

    if topo.strategy == "tp":
        tp, pp = topo.tensor_parallel_size or 8, topo.pipeline_parallel_size
        everywhere("tensor_parallel_size", tp, "spec.topology.tensorParallelSize")
        everywhere("pipeline_parallel_size", pp, "spec.topology.pipelineParallelSize")
        everywhere("data_parallel_size", 1, "one engine")
        everywhere("enable_expert_parallel", False, "no expert parallelism with tp")
        if (tp * pp != n * g) if multi else (tp * pp > g):
            out.append(f"{case.name}: {n} rank(s) of {g} GPUs for TP{tp} x PP{pp}: GPUs left idle or missing")
        for rank in range(n):
            differs(rank, "nnodes", n if multi else d["nnodes"], "one vLLM node per pod")
            differs(rank, "node_rank", rank if multi else d["node_rank"], "pods in rank order")
            differs(rank, "master_addr", ADDRESS if multi else d["master_addr"], "the leader's address")
            differs(rank, "headless", multi and rank > 0, "only the leader serves the API")
        if multi and len({x.get("master_port") for x in got}) != 1:
            out.append(f"{case.name}: --master-port differs between ranks: {[x.get('master_port') for x in got]}")
        everywhere("data_parallel_address", d["data_parallel_address"], "no data parallelism")
        return out

    dp = topo.data_parallel_size
    tp = 1 if topo.strategy == "dep" else (topo.tensor_parallel_size or g)
    ep = topo.strategy == "dep" or bool(raw.get("expertParallel"))
    everywhere("tensor_parallel_size", tp, "TP 1 with dep" if topo.strategy == "dep" else "spec.topology.tensorParallelSize")
    everywhere("pipeline_parallel_size", 1, "no pipeline parallelism with dep or tp-dp")
    everywhere("data_parallel_size", dp, "spec.topology.dataParallelSize")
    everywhere("enable_expert_parallel", ep, "always with dep, spec.topology.expertParallel with tp-dp")
    local = [x.get("data_parallel_size_local") for x in got]
    if len(set(local)) != 1 or not isinstance(local[0], int) or sum(local) != dp:
        out.append(f"{case.name}: --data-parallel-size-local per rank {local} does not split {dp} ranks evenly")
    elif (tp * local[0] != g) if multi else (tp * local[0] > g):
        out.append(f"{case.name}: {local[0]} local rank(s) of TP{tp} on {g} GPUs per node: GPUs left idle or missing")
    else:
        for rank in range(n):
            differs(rank, "data_parallel_start_rank", sum(local[:rank]) if rank else d["data_parallel_start_rank"],
                    "the data-parallel ranks of the pods before it; the leader's 0 implied")
    if ep:
        backend = e.all2all_backend or (d["all2all_backend"] if e.moe_backend == "deep_gemm_mega_moe"
                                        else ALL2ALL_WHEN_UNSET[topo.accelerator])
    else:
        backend = d["all2all_backend"]
    everywhere("all2all_backend", backend, "spec.engine.all2allBackend, else ALL2ALL_WHEN_UNSET")
    for rank in range(n):
        differs(rank, "data_parallel_address", ADDRESS if multi else d["data_parallel_address"], "the leader's address")
        differs(rank, "headless", multi and rank > 0, "only the leader serves the API")
        differs(rank, "nnodes", d["nnodes"], "data parallelism launches without --nnodes")
        if not multi:
            differs(rank, "data_parallel_rpc_port", d["data_parallel_rpc_port"], "one node: no coordinator")
    ports = {x.get("data_parallel_rpc_port") for x in got}
    if multi and (len(ports) != 1 or ports == {d["data_parallel_rpc_port"]}):
        out.append(f"{case.name}: --data-parallel-rpc-port must be one port of the operator's on every rank: {ports}")
    return out


PVC = {"pvc": {"claimName": "kimi-k3-weights"}}
STATED_LAYOUTS: list[tuple[str, dict[str, Any], list[dict[str, Any]]]] = [
    # (name, spec, per rank: the parsed parallel fields; DEFAULT = vLLM's own default)
    ("gb300-tp8", {"model": {"source": PVC}}, [
        {"tensor_parallel_size": 8, "nnodes": 2, "node_rank": r, "master_addr": ADDRESS, "master_port": 29501,
         "headless": r == 1, "data_parallel_size": 1, "enable_expert_parallel": False} for r in range(2)]),
    ("gb200-tp16", {"model": {"source": PVC}, "topology": {"accelerator": "gb200", "tensorParallelSize": 16}}, [
        {"tensor_parallel_size": 16, "nnodes": 4, "node_rank": r, "master_addr": ADDRESS, "headless": r > 0}
        for r in range(4)]),
    ("h200-tp16", {"model": {"source": PVC}, "topology": {"accelerator": "h200", "tensorParallelSize": 16}}, [
        {"tensor_parallel_size": 16, "nnodes": 2, "node_rank": r, "master_addr": ADDRESS, "headless": r > 0}
        for r in range(2)]),
    ("b300-tp8", {"model": {"source": PVC}, "topology": {"accelerator": "b300", "tensorParallelSize": 8}}, [
        {"tensor_parallel_size": 8, "nnodes": DEFAULT, "node_rank": DEFAULT, "master_addr": DEFAULT,
         "headless": False}]),
    ("gb300-dep16", {"model": {"source": PVC}, "topology": {"strategy": "dep", "dataParallelSize": 16}}, [
        {"tensor_parallel_size": 1, "data_parallel_size": 16, "data_parallel_size_local": 4,
         "data_parallel_start_rank": 4 * r if r else DEFAULT, "data_parallel_address": ADDRESS,
         "data_parallel_rpc_port": 13345, "enable_expert_parallel": True,
         "all2all_backend": "flashinfer_nvlink_one_sided", "headless": r > 0, "nnodes": DEFAULT} for r in range(4)]),
    ("h200-dep16", {"model": {"source": PVC}, "topology": {"accelerator": "h200", "strategy": "dep",
                                                          "dataParallelSize": 16}}, [
        {"data_parallel_size": 16, "data_parallel_size_local": 8, "data_parallel_start_rank": 8 * r if r else DEFAULT,
         "enable_expert_parallel": True, "all2all_backend": "deepep_v2", "headless": r > 0} for r in range(2)]),
    ("gb300-tp4-dp4-ep", {"model": {"source": PVC}, "topology": {"strategy": "tp-dp", "tensorParallelSize": 4,
                                                                "dataParallelSize": 4, "expertParallel": True}}, [
        {"tensor_parallel_size": 4, "data_parallel_size": 4, "data_parallel_size_local": 1,
         "data_parallel_start_rank": r if r else DEFAULT, "enable_expert_parallel": True,
         "all2all_backend": "flashinfer_nvlink_one_sided", "headless": r > 0} for r in range(4)]),
    ("b300-dep8", {"model": {"source": PVC}, "topology": {"accelerator": "b300", "strategy": "dep",
                                                         "dataParallelSize": 8}}, [
        {"tensor_parallel_size": 1, "data_parallel_size": 8, "data_parallel_size_local": 8,
         "data_parallel_start_rank": DEFAULT, "data_parallel_address": DEFAULT, "data_parallel_rpc_port": DEFAULT,
         "enable_expert_parallel": True, "all2all_backend": "deepep_v2", "headless": False}]),
]
"""Whole groups written out rank by rank: what vLLM must parse for each pod of these specs."""


def stated_layout_cases() -> list[Case]:
    return [make_case(f"stated:{name}", spec) for name, spec, _ in STATED_LAYOUTS]


def stated_problems(case: Case, results: list[dict[str, Any]], defaults: dict[str, Any], version: str) -> list[str]:
    """Differences between vLLM's parse of a STATED_LAYOUTS case and its stated ranks."""
    (ranks,) = [r for name, _, r in STATED_LAYOUTS if f"stated:{name}" == case.name]
    if len(results) != len(ranks):
        return [f"{case.name}: {len(results)} rank(s), the layout states {len(ranks)}"]
    out = []
    for rank, (res, fields) in enumerate(zip(results, ranks)):
        if not res["ok"]:
            out.append(f"{case.name} rank {rank}: vLLM {version} rejected the arguments ({res['stage']}): {res['error']}")
            continue
        parsed = {**res["args"], **res["engine"]}
        for key, value in fields.items():
            value = defaults[key] if value is DEFAULT else value
            if not _same(parsed.get(key), value):
                out.append(f"{case.name} rank {rank}: {LAYOUT_FLAGS[key]}: vLLM {version} parsed {key}="
                           f"{parsed.get(key)!r}, stated {value!r}")
    return out


def parsed_value(result: dict[str, Any], key: str) -> Any:
    if key == "compilation_config.cudagraph_mode":
        cc = result["engine"]["compilation_config"]
        return cc.get("cudagraph_mode") if isinstance(cc, dict) else cc
    if key in result["engine"]:
        return result["engine"][key]
    return result["args"][key]


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return isinstance(a, (int, float)) and isinstance(b, (int, float)) and abs(a - b) < 1e-9
    return a == b


def problems(case: Case, results: list[dict[str, Any]], defaults: dict[str, Any], version: str) -> list[str]:
    """Every way vLLM's parse of the case's ranks differs from the spec, each naming the flag:
    rejected arguments, a field not as the spec asks (``field_expectations``), a group vLLM could
    not run as laid out (``layout_problems``), a refusal by vLLM's own config checks."""
    out = []
    fields = field_expectations(case, defaults)
    for rank, res in enumerate(results):
        where = f"{case.name} rank {rank}"
        if not res["ok"]:
            out.append(f"{where}: vLLM {version} rejected the arguments ({res['stage']}): {res['error']}")
            continue
        for key, (flag, want) in fields.items():
            got = parsed_value(res, key)
            if not _same(got, want):
                out.append(f"{where}: {flag}: vLLM {version} parsed {key}={got!r}, the spec asks for {want!r}")
        for p in res.get("problems", []):
            out.append(f"{where}: vLLM {version}'s {p['check']} refuses it: {p['error']}")
    if all(res["ok"] for res in results):
        out += layout_problems(case, results, defaults, version)
    return out


def defaults_of(result: dict[str, Any]) -> dict[str, Any]:
    """vLLM's values for a bare ``vllm serve /models`` (flattened engine + serve options)."""
    assert result["ok"], result
    return {**result["args"], **result["engine"]}
