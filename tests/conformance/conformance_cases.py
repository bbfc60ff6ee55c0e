"""Specs to check against vLLM, and what each rank's parsed arguments must hold.

``recipe_cases()`` reads recipes/; ``generated_cases()`` draws a broad, deterministic set of specs
over every strategy, accelerator profile, speculative method, decode backend, MoE and all-to-all
backend, KV-cache dtype and more, keeping those admission accepts. ``expected(case, rank)`` says,
from the spec alone (not from the argument builder or the plan), what vLLM must parse for a rank;
``problems(case, results)`` compares vLLM's parse of every rank with it and names the flag of
every difference, so a wrong flag or value in a builder fails with the flag in the message.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from kimik3.admission import Seconds, admit
from kimik3.api.errors import SpecErrors
from kimik3.api.v1alpha1 import KimiK3DeploymentSpec
from kimik3.engine.args import DP_RPC_PORT, LEADER_ADDRESS, MASTER_PORT, engine_env, rank_args
from kimik3.topology.plan import GroupPlan
from kimik3.kube.accelerators import PROFILES

REPO = Path(__file__).resolve().parents[2]
ADDRESS = "k3-0.k3.inference.svc.cluster.local"
"""What the launcher puts in place of the leader placeholder (an LWS leader DNS name)."""
ITL_BUCKETS = [0.001, 0.002, 0.003, 0.004, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.1]

ACCELERATORS = ["gb300", "gb200", "b300", "b200", "h200"]
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
    for path in sorted((REPO / "recipes").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if doc and doc.get("kind") == "KimiK3Deployment":
                cases.append(make_case(f"{path.name}:{doc['metadata']['name']}", doc["spec"]))
    return cases


def _draw(rng: random.Random) -> dict[str, Any]:
    acc = rng.choice(ACCELERATORS)
    g = PROFILES[acc].gpus_per_node
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
    source = rng.choice([{"pvc": {"claimName": "w"}}, {"pvc": {"claimName": "w", "subPath": "k3/mxfp4"}},
                         {"hostPath": {"path": "/data/k3"}}, {"hub": {}}])
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

def _model_path(spec: KimiK3DeploymentSpec) -> str:
    src = spec.model.source
    if src.pvc is not None:
        return "/models/" + src.pvc.sub_path.strip("/") if src.pvc.sub_path else "/models"
    return "/models" if src.host_path is not None else spec.model.name


def expected_speculative_config(spec: KimiK3DeploymentSpec) -> dict[str, Any] | None:
    """The --speculative-config dict in vLLM's snake_case keys, from the typed fields."""
    sd = spec.speculative_decoding
    if sd.method == "none":
        return None
    out: dict[str, Any] = {"method": sd.method, "num_speculative_tokens": sd.num_speculative_tokens}
    for key, value in (("model", sd.draft_model), ("draft_sample_method", sd.draft_sample_method),
                       ("rejection_sample_method", sd.rejection_sample_method),
                       ("draft_tensor_parallel_size", sd.draft_tensor_parallel_size),
                       ("prompt_lookup_min", sd.prompt_lookup_min), ("prompt_lookup_max", sd.prompt_lookup_max)):
        if value is not None:
            out[key] = value
    if sd.adaptive_verification:
        out["enable_adaptive_verification"] = True
    return out


def expected(case: Case, rank: int, defaults: dict[str, Any]) -> dict[str, tuple[str, Any]]:
    """{parsed field: (flag, value)} that vLLM's parse of ``rank`` must hold. ``defaults`` is
    vLLM's parse of a bare ``vllm serve /models`` (what an unset field means)."""
    spec = case.spec
    e, m, f, topo = spec.engine, spec.model, spec.model.features, spec.topology
    d = defaults
    g = PROFILES[topo.accelerator].gpus_per_node
    out: dict[str, tuple[str, Any]] = {
        "model": ("<model>", _model_path(spec)),
        "served_model_name": ("--served-model-name", [m.served_model_name]),
        "trust_remote_code": ("--trust-remote-code", True),
        "port": ("--port", spec.service.port),
        "revision": ("--revision", m.revision),
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
        "enable_prefix_caching": ("--enable-prefix-caching", True if f.prefix_caching else d["enable_prefix_caching"]),
        "language_model_only": ("--language-model-only", f.language_model_only),
        "speculative_config": ("--speculative-config", expected_speculative_config(spec)),
    }
    if "--custom-histogram-buckets" in e.extra_args:
        out["custom_histogram_buckets"] = ("--custom-histogram-buckets", {"inter_token_latency": ITL_BUCKETS})

    if topo.strategy == "tp":
        tp, pp = topo.tensor_parallel_size or 8, topo.pipeline_parallel_size
        nodes = max(1, tp * pp // g)
        multi = nodes > 1
        out |= {
            "tensor_parallel_size": ("--tensor-parallel-size", tp),
            "pipeline_parallel_size": ("--pipeline-parallel-size", pp),
            "data_parallel_size": ("--data-parallel-size", 1),
            "enable_expert_parallel": ("--enable-expert-parallel", False),
            "nnodes": ("--nnodes", nodes if multi else d["nnodes"]),
            "node_rank": ("--node-rank", rank if multi else d["node_rank"]),
            "master_addr": ("--master-addr", ADDRESS if multi else d["master_addr"]),
            "master_port": ("--master-port", MASTER_PORT if multi else d["master_port"]),
            "data_parallel_address": ("--data-parallel-address", d["data_parallel_address"]),
            "headless": ("--headless", multi and rank > 0),
        }
    else:
        ep = topo.strategy == "dep" or bool(topo.expert_parallel)
        tp = 1 if topo.strategy == "dep" else (topo.tensor_parallel_size or g)
        dp = topo.data_parallel_size
        dp_local = min(g // tp, dp)
        nodes = dp // dp_local
        multi = nodes > 1
        all2all = d["all2all_backend"]
        if ep:
            all2all = e.all2all_backend or (d["all2all_backend"] if e.moe_backend == "deep_gemm_mega_moe" else
                                            "flashinfer_nvlink_one_sided" if PROFILES[topo.accelerator].multi_node_nvlink
                                            else "deepep_v2")
        out |= {
            "tensor_parallel_size": ("--tensor-parallel-size", tp),
            "pipeline_parallel_size": ("--pipeline-parallel-size", 1),
            "data_parallel_size": ("--data-parallel-size", dp),
            "data_parallel_size_local": ("--data-parallel-size-local", dp_local),
            "enable_expert_parallel": ("--enable-expert-parallel", ep),
            "all2all_backend": ("--all2all-backend", all2all),
            "data_parallel_address": ("--data-parallel-address", ADDRESS if multi else d["data_parallel_address"]),
            "data_parallel_rpc_port": ("--data-parallel-rpc-port", DP_RPC_PORT if multi else d["data_parallel_rpc_port"]),
            "data_parallel_start_rank": ("--data-parallel-start-rank",
                                         rank * dp_local if multi and rank > 0 else d["data_parallel_start_rank"]),
            "nnodes": ("--nnodes", d["nnodes"]),
            "headless": ("--headless", multi and rank > 0),
        }
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
    """Every way vLLM's parse of the case's ranks differs from the spec, each naming the flag."""
    out = []
    for rank, res in enumerate(results):
        where = f"{case.name} rank {rank}"
        if not res["ok"]:
            out.append(f"{where}: vLLM {version} rejected the arguments ({res['stage']}): {res['error']}")
            continue
        for key, (flag, want) in expected(case, rank, defaults).items():
            got = parsed_value(res, key)
            if not _same(got, want):
                out.append(f"{where}: {flag}: vLLM {version} parsed {key}={got!r}, the spec asks for {want!r}")
        for p in res.get("problems", []):
            out.append(f"{where}: vLLM {version}'s {p['check']} refuses it: {p['error']}")
    return out


def defaults_of(result: dict[str, Any]) -> dict[str, Any]:
    """vLLM's values for a bare ``vllm serve /models`` (flattened engine + serve options)."""
    assert result["ok"], result
    return {**result["args"], **result["engine"]}
