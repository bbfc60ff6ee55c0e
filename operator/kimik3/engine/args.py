"""vLLM command lines and environment of every rank of a group.

``rank_args(spec, plan, rank)`` returns the arguments after ``vllm serve`` for pod ``rank`` of a
group (0 = leader). The leader's address is not known when the operator renders (it is the
leader pod's DNS name, set by LeaderWorkerSet as ``LWS_LEADER_ADDRESS``), so the arguments hold
``LEADER_ADDRESS`` and the in-pod launcher substitutes it after the name resolves.

Launch lines follow vLLM's multi-node documentation for 0.33 (no Ray), see kimi-k3-and-vllm.md:
- tp:    ``--tensor-parallel-size T --nnodes N --node-rank i --master-addr L --master-port P``; i > 0 ``--headless``
- tp-dp: ``--tensor-parallel-size T --data-parallel-size D --data-parallel-size-local d
          --data-parallel-address L --data-parallel-rpc-port P``; i > 0 ``--data-parallel-start-rank i*d --headless``
         (on the leader vLLM 0.33 would take an explicit start rank as hybrid load balancing)
- dep:   the tp-dp line with T=1, d = GPUs per node, plus ``--enable-expert-parallel --all2all-backend B``.
"""

from __future__ import annotations

import json
import math
from typing import Any

from kimik3.api.v1alpha1 import KimiK3DeploymentSpec, duration_seconds
from kimik3.engine.kvcache import offload_gib
from kimik3.engine.weights import drafter_path, model_path, offline
from kimik3.topology.plan import GroupPlan

LEADER_ADDRESS = "${LWS_LEADER_ADDRESS}"
"""Placeholder the launcher replaces with the resolved leader address."""
MASTER_PORT = 29501
"""torch.distributed rendezvous port of multi-node TP (vLLM's documented example port)."""
DP_RPC_PORT = 13345
"""Data-parallel coordinator RPC port (vLLM's documented example port)."""
API_PORT_NAME = "http"
VLLM_VERSION = "0.33.0"
"""The engine version the arguments are written for (the megakernel decode path is new in 0.33.0)."""

OWNED_FLAGS = frozenset({
    "--model", "--served-model-name", "--port", "--host", "--trust-remote-code", "--revision",
    "--tensor-parallel-size", "-tp", "--pipeline-parallel-size", "-pp", "--data-parallel-size", "-dp",
    "--data-parallel-size-local", "-dpl", "--data-parallel-address", "-dpa", "--data-parallel-rpc-port", "-dpp",
    "--data-parallel-start-rank", "-dpr", "--data-parallel-hybrid-lb", "--data-parallel-external-lb",
    "--enable-expert-parallel", "-ep", "--nnodes", "-n", "--node-rank", "-r", "--master-addr", "--master-port",
    "--headless", "--speculative-config", "-sc", "--additional-config", "--kv-cache-dtype",
    "--gpu-memory-utilization", "--max-num-seqs", "--max-num-batched-tokens", "--max-model-len",
    "--moe-backend", "--all2all-backend", "--load-format", "--enforce-eager", "--compilation-config", "-cc",
    "--enable-prefix-caching", "--no-enable-prefix-caching", "--tool-call-parser", "--enable-auto-tool-choice",
    "--reasoning-parser", "--language-model-only", "--shutdown-timeout",
    "--kv-offloading-size", "--kv-offloading-backend",
})
"""Flags the operator derives from typed fields; ``spec.engine.extraArgs`` may not set them
(kimik3.admission.extra_args refuses them)."""


def speculative_config(spec: KimiK3DeploymentSpec) -> dict[str, Any] | None:
    """The ``--speculative-config`` value in vLLM's snake_case keys, or None when method is none."""
    sd = spec.speculative_decoding
    if sd.method == "none":
        return None
    cfg: dict[str, Any] = {"method": sd.method, "num_speculative_tokens": sd.num_speculative_tokens}
    drafter = drafter_path(spec)
    if drafter is not None:
        cfg["model"] = drafter  # a local folder whenever the engines run offline (F23)
        if sd.draft_revision and not offline(spec):
            cfg["revision"] = sd.draft_revision
    if sd.draft_sample_method:
        cfg["draft_sample_method"] = sd.draft_sample_method
    if sd.rejection_sample_method:
        cfg["rejection_sample_method"] = sd.rejection_sample_method
    if sd.adaptive_verification:
        cfg["enable_adaptive_verification"] = True
    if sd.draft_tensor_parallel_size:
        cfg["draft_tensor_parallel_size"] = sd.draft_tensor_parallel_size
    if sd.prompt_lookup_min is not None:
        cfg["prompt_lookup_min"] = sd.prompt_lookup_min
    if sd.prompt_lookup_max is not None:
        cfg["prompt_lookup_max"] = sd.prompt_lookup_max
    return cfg


def _json(value: dict[str, Any]) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def normalize_flag(arg: str) -> str:
    """The flag an argument sets, spelled as vLLM's FlexibleArgumentParser reads it: the text
    before ``=``, before a ``.`` (``--json-arg.key value`` sets one key of a JSON flag), with
    ``_`` read as ``-`` (``--tensor_parallel_size`` is ``--tensor-parallel-size``)."""
    flag = arg.split("=", 1)[0].split(".", 1)[0]
    if flag.startswith("--"):
        return "--" + flag[2:].replace("_", "-")
    return flag


API_KEY_FLAG = "--api-key"
API_KEY_ENV = "VLLM_API_KEY"
"""vLLM reads the API key from ``--api-key`` first, then this environment variable."""
HUB_TOKEN_ENV = "HF_TOKEN"
"""huggingface_hub reads the hub token from this environment variable."""
HUB_TOKEN_FLAG = "--hf-token"
"""vLLM 0.33's flag for the hub token (``EngineArgs.hf_token``): a value given to it is plain text."""


def secret_env(spec: KimiK3DeploymentSpec) -> list[str]:
    """Names of the engine variables the pods read from Secrets (``secretKeyRef``): the launcher
    redacts their values wherever they appear in the command line it logs (failure case F22)."""
    hub = spec.model.source.hub
    return ([API_KEY_ENV] if spec.service.api_key_secret is not None else []) + \
        ([HUB_TOKEN_ENV] if hub is not None and hub.token_secret is not None else [])


def leader_lost_timeout_s(spec: KimiK3DeploymentSpec) -> int:
    """How long a headless worker keeps running while its leader's endpoint does not answer (the
    launcher's group watchdog, failure case F20): ``probes.periodSeconds`` x
    ``probes.livenessFailureThreshold`` (60 s by default), the bound after which the kubelet
    restarts a leader whose /health stopped answering, so a worker gives up on its leader no later
    than the leader's own liveness probe would."""
    return spec.probes.period_seconds * spec.probes.liveness_failure_threshold


def shutdown_timeout_s(spec: KimiK3DeploymentSpec) -> int:
    """vLLM's ``--shutdown-timeout`` (whole seconds, ``probes.drainTimeout`` rounded up): on SIGTERM,
    vLLM 0.33 refuses new requests and lets those in flight finish for up to this long, then aborts
    the rest (0: aborts them at once, its default; ``VllmConfig.shutdown_timeout``)."""
    return math.ceil(duration_seconds(spec.probes.drain_timeout))


def common_args(spec: KimiK3DeploymentSpec) -> list[str]:
    """Arguments every rank shares (model, kernels, batch limits, features, speculation)."""
    e, m = spec.engine, spec.model
    args = [model_path(spec), "--served-model-name", m.served_model_name, "--trust-remote-code",
            "--port", str(spec.service.port)]
    if m.revision and m.source.cache is None:  # a cache folder is one revision already
        args += ["--revision", m.revision]
    if m.max_model_len:
        args += ["--max-model-len", str(m.max_model_len)]
    args += ["--shutdown-timeout", str(shutdown_timeout_s(spec)),
             "--kv-cache-dtype", e.kv_cache_dtype,
             "--gpu-memory-utilization", f"{e.gpu_memory_utilization:g}",
             "--max-num-seqs", str(e.max_num_seqs),
             "--max-num-batched-tokens", str(e.max_num_batched_tokens)]
    if e.moe_backend:
        args += ["--moe-backend", e.moe_backend]
    if e.load_format:
        args += ["--load-format", e.load_format]
    if e.enforce_eager:
        args.append("--enforce-eager")
    if e.cudagraph_mode:
        args += ["--compilation-config", _json({"cudagraph_mode": e.cudagraph_mode})]
    if e.decode_backend == "latency_specialized":
        args += ["--additional-config", _json({"decode_backend": "latency_specialized"})]
    f = m.features
    if f.tool_calling:
        args += ["--enable-auto-tool-choice", "--tool-call-parser", "kimi_k3"]
    if f.reasoning_parser:
        args += ["--reasoning-parser", "kimi_k3"]
    # vLLM 0.33 turns prefix caching on by default for hybrid generative models (K3's KDA layers:
    # ModelConfig.is_prefix_caching_supported), so off must be said (tests/conformance).
    args.append("--enable-prefix-caching" if f.prefix_caching else "--no-enable-prefix-caching")
    if f.language_model_only:
        args.append("--language-model-only")
    if e.kv_offload is not None:  # vLLM 0.33 sets its OffloadingConnector up from these two
        args += ["--kv-offloading-size", str(offload_gib(spec)), "--kv-offloading-backend", e.kv_offload.backend]
    sc = speculative_config(spec)
    if sc is not None:
        args += ["--speculative-config", _json(sc)]
    return args


def parallel_args(spec: KimiK3DeploymentSpec, plan: GroupPlan, rank: int) -> list[str]:
    """The parallelism and multi-node arguments of pod ``rank`` (0 = leader)."""
    if not 0 <= rank < plan.nodes_per_group:
        raise ValueError(f"rank {rank} outside a group of {plan.nodes_per_group} pods")
    args: list[str] = []
    if plan.strategy == "tp":
        args += ["--tensor-parallel-size", str(plan.tensor_parallel_size)]
        if plan.pipeline_parallel_size > 1:
            args += ["--pipeline-parallel-size", str(plan.pipeline_parallel_size)]
        if plan.multi_node:
            args += ["--nnodes", str(plan.nodes_per_group), "--node-rank", str(rank),
                     "--master-addr", LEADER_ADDRESS, "--master-port", str(MASTER_PORT)]
    else:
        args += ["--tensor-parallel-size", str(plan.tensor_parallel_size),
                 "--data-parallel-size", str(plan.data_parallel_size),
                 "--data-parallel-size-local", str(plan.data_parallel_size_local)]
        if plan.multi_node:
            args += ["--data-parallel-address", LEADER_ADDRESS,
                     "--data-parallel-rpc-port", str(DP_RPC_PORT)]
            if rank > 0:
                # Not on the leader: vLLM 0.33.0 reads an explicit start rank on a non-headless
                # node as hybrid load balancing (and, with one DP rank per node, as external load
                # balancing), so the leader's API server would serve only its own node's engines
                # while the headless workers' engines idle (EngineArgs.create_engine_config;
                # tests/conformance checks the resulting ParallelConfig). Its start rank is 0.
                args += ["--data-parallel-start-rank", str(rank * plan.data_parallel_size_local)]
        if plan.expert_parallel:
            args.append("--enable-expert-parallel")
            backend = spec.engine.all2all_backend
            if backend is None and spec.engine.moe_backend != "deep_gemm_mega_moe":
                backend = "flashinfer_nvlink_one_sided" if plan.profile.multi_node_nvlink else "deepep_v2"
            if backend:
                args += ["--all2all-backend", backend]
    if plan.multi_node and rank > 0:
        args.append("--headless")
    return args


def rank_args(spec: KimiK3DeploymentSpec, plan: GroupPlan, rank: int) -> list[str]:
    """Everything after ``vllm serve`` for pod ``rank``: common, parallel, then extraArgs."""
    return common_args(spec) + parallel_args(spec, plan, rank) + list(spec.engine.extra_args)


COMPILE_CACHE_MOUNT = "/compile-cache"
"""Where the compile cache claim is mounted (read-write) in every engine pod."""


def compile_cache_env() -> dict[str, str]:
    """Where vLLM 0.33 keeps what it compiles, all on the compile cache (read in its source):
    ``VLLM_CACHE_ROOT`` holds ``torch_compile_cache/<hash>/rank_<r>_<dp>/`` (the AOT-compiled
    graphs, with Inductor's ``inductor_cache`` and Triton's ``triton_cache`` set below them by
    ``compilation/compiler_interface.py``) and ``deep_gemm/`` (``DG_JIT_CACHE_DIR`` defaults to it,
    ``utils/deep_gemm.py``); FlashInfer's autotune results go to
    ``VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR``. vLLM leaves both variables out of its compile hash
    (``envs.py``: location-only)."""
    return {"VLLM_CACHE_ROOT": COMPILE_CACHE_MOUNT,
            "VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR": f"{COMPILE_CACHE_MOUNT}/flashinfer_autotune"}


def engine_env(spec: KimiK3DeploymentSpec, plan: GroupPlan, load_timeout_s: float) -> dict[str, str]:
    """Environment of every engine container (values from the GB300 recipes, kimi-k3-and-vllm.md);
    ``load_timeout_s`` is ``probes.loadTimeout`` in seconds (``Admitted.seconds.load_timeout``).

    User ``spec.engine.env`` entries override these."""
    env = {
        "VLLM_ENGINE_READY_TIMEOUT_S": str(int(load_timeout_s)),
        "VLLM_USE_V2_MODEL_RUNNER": "1",
    }
    if plan.profile.multi_node_nvlink:
        env |= {"VLLM_ALLREDUCE_USE_FLASHINFER": "1", "VLLM_FLASHINFER_ALLREDUCE_BACKEND": "mnnvl",
                "VLLM_USE_NCCL_SYMM_MEM": "0", "NCCL_MNNVL_ENABLE": "1", "NCCL_CUMEM_ENABLE": "1"}
    if offline(spec):
        env |= {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    else:
        env["HF_HOME"] = "/hf-cache"
    if spec.engine.compile_cache is not None:
        env |= compile_cache_env()
    for var in spec.engine.env:
        env[var.name] = var.value
    return env
