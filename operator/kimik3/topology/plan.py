"""The parallel plan of one engine group, derived from the spec's topology.

``plan_group(spec)`` returns a ``GroupPlan`` (GPUs per node, nodes per group, TP/PP/DP sizes,
whether expert parallelism, a ComputeDomain and clique placement are needed) or raises
``SpecErrors`` listing every shape problem with its field path and what would fit.

Launch shapes (vLLM multi-node without Ray, see kimi-k3-and-vllm.md):
- tp: one engine of TP x PP GPUs over N = TP x PP / GPUs-per-node nodes (``--nnodes``/``--node-rank``).
- tp-dp: TP inside a node, GPUs-per-node / TP data-parallel ranks per node, DP / that many nodes.
- dep: DP = the group's GPUs, TP=1 per rank, expert parallelism, GPUs-per-node ranks per node.
"""

from __future__ import annotations

from dataclasses import dataclass

from kimik3.api.errors import SpecError, SpecErrors
from kimik3.api.v1alpha1 import KimiK3DeploymentSpec
from kimik3.kube.accelerators import MODEL_MEMORY_FLOOR_GB, PROFILES, AcceleratorProfile


@dataclass(frozen=True)
class GroupPlan:
    """One engine group: a LeaderWorkerSet group of ``nodes_per_group`` pods."""

    profile: AcceleratorProfile
    strategy: str
    tensor_parallel_size: int
    pipeline_parallel_size: int
    data_parallel_size: int
    """Data-parallel engines in the group (1 for tp)."""
    data_parallel_size_local: int
    """Data-parallel engines per node."""
    expert_parallel: bool
    gpus_per_node: int
    """GPUs each pod requests (``nvidia.com/gpu``)."""
    nodes_per_group: int
    """Pods per group (LeaderWorkerSet size), leader included."""

    @property
    def gpus_per_group(self) -> int:
        return self.gpus_per_node * self.nodes_per_group

    @property
    def multi_node(self) -> bool:
        return self.nodes_per_group > 1

    @property
    def needs_compute_domain(self) -> bool:
        """Multi-node groups on NVL72 trays share GPU memory over NVLink through IMEX channels
        that a ComputeDomain provides; single-node groups and HGX nodes do not need one."""
        return self.multi_node and self.profile.multi_node_nvlink

    @property
    def clique_placement(self) -> bool:
        """Each group alone inside one NVLink domain (``nvidia.com/gpu.clique``)."""
        return self.needs_compute_domain


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def plan_group(spec: KimiK3DeploymentSpec) -> GroupPlan:
    """Derive the plan of one group. Raises SpecErrors naming every field that does not fit."""
    topo = spec.topology
    profile = PROFILES[topo.accelerator]
    g = profile.gpus_per_node
    errors: list[SpecError] = []
    pp = topo.pipeline_parallel_size
    tp = topo.tensor_parallel_size or {"tp": 8, "dep": 1, "tp-dp": g}[topo.strategy]
    dp = topo.data_parallel_size or 1
    need = MODEL_MEMORY_FLOOR_GB[spec.model.variant]
    min_copy_gpus = -(-need // profile.gpu_memory_gb)
    """Fewest GPUs of this profile that hold one copy of the weights: suggestions never go below."""

    if topo.strategy == "tp":
        if topo.data_parallel_size not in (None, 1):
            errors.append(SpecError("spec.topology.dataParallelSize",
                                    "strategy tp takes no dataParallelSize: use strategy tp-dp or dep"))
        if topo.expert_parallel:
            errors.append(SpecError("spec.topology.expertParallel",
                                    "strategy tp has no expert parallelism: use strategy dep or tp-dp"))
        gpus = tp * pp
        if gpus > g and gpus % g:
            fits = [x for x in range(g, 73, g) if x % pp == 0 and x >= min_copy_gpus][:2]
            errors.append(SpecError(
                "spec.topology.tensorParallelSize",
                f"TP x PP = {gpus} GPUs neither fits one {topo.accelerator} node ({g} GPUs) nor fills whole "
                f"nodes: use {' or '.join(str(x // pp) for x in fits)}"))
        nodes = max(1, gpus // g)
        per_node = min(gpus, g)
        dp_local, ep = 1, False
    else:
        if topo.data_parallel_size is None:
            errors.append(SpecError("spec.topology.dataParallelSize", f"strategy {topo.strategy} needs dataParallelSize"))
        if pp != 1:
            errors.append(SpecError("spec.topology.pipelineParallelSize",
                                    "pipeline parallelism is supported with strategy tp only"))
        if topo.strategy == "dep":
            if tp != 1:
                errors.append(SpecError("spec.topology.tensorParallelSize",
                                        "strategy dep runs TP=1 per rank: set dataParallelSize to the group's GPUs"))
            tp, ep, dp_local = 1, True, g
            if dp % g:
                lower, upper = (dp // g) * g, (dp // g + 1) * g
                fit = " or ".join(str(x) for x in (lower, max(upper, -(-min_copy_gpus // g) * g))
                                  if x >= min_copy_gpus)
                errors.append(SpecError(
                    "spec.topology.dataParallelSize",
                    f"DP={dp} does not divide into {topo.accelerator} nodes of {g} GPUs: use {fit}"))
        else:  # tp-dp
            ep = bool(topo.expert_parallel)
            if g % tp:
                errors.append(SpecError(
                    "spec.topology.tensorParallelSize",
                    f"tp-dp keeps TP inside a node: TP={tp} must divide the {g} GPUs of a {topo.accelerator} node "
                    f"(use {', '.join(map(str, _divisors(g)))}), or use strategy tp for TP across nodes"))
                dp_local = 1
            else:
                dp_local = g // tp
                if dp % dp_local:
                    # With expert parallelism one copy of the weights spans all DP x TP GPUs.
                    floor = -(-min_copy_gpus // tp) if ep else 1
                    fits = [x for x in (dp - dp % dp_local, dp + dp_local - dp % dp_local)
                            if x >= max(dp_local, floor)]
                    if not fits:
                        fits = [-(-max(floor, dp_local) // dp_local) * dp_local]
                    errors.append(SpecError(
                        "spec.topology.dataParallelSize",
                        f"with TP={tp} a {topo.accelerator} node holds {dp_local} DP ranks: DP={dp} must be a multiple "
                        f"of {dp_local} (use {' or '.join(map(str, fits))})"))
        dp_local = min(dp_local, dp)
        nodes = max(1, dp // dp_local)
        per_node = tp * dp_local

    # Memory: the GPUs that hold one copy of the weights must hold the model.
    copy_gpus = tp * pp if not (topo.strategy != "tp" and ep) else dp * tp
    have = copy_gpus * profile.gpu_memory_gb
    if have < need:
        min_gpus = min_copy_gpus
        fit = next(x for x in (8, 16, 24, 32, 48, 64, 72) if x >= min_gpus)
        errors.append(SpecError(
            "spec.topology",
            f"one copy of Kimi K3 ({spec.model.variant}, ~{need} GB) is spread over {copy_gpus} {topo.accelerator} "
            f"GPUs = {have} GB: needs >= {min_gpus} GPUs; use {fit} (e.g. strategy tp with tensorParallelSize {fit}, "
            f"or dep with dataParallelSize {fit})"))

    if nodes > profile.nvlink_domain_nodes and profile.multi_node_nvlink:
        errors.append(SpecError(
            "spec.topology",
            f"a group of {nodes} {topo.accelerator} trays exceeds one NVL72 rack ({profile.nvlink_domain_nodes} trays)"))

    errors += _megakernel_errors(spec, tp, ep)
    errors += _extra_args_shape_errors(spec, tp)
    errors += _speculative_errors(spec, tp, pp)
    if errors:
        raise SpecErrors(errors)
    return GroupPlan(profile, topo.strategy, tp, pp, dp if topo.strategy != "tp" else 1, dp_local, ep,
                     per_node, nodes)


def _megakernel_errors(spec: KimiK3DeploymentSpec, tp: int, expert_parallel: bool) -> list[SpecError]:
    """vLLM 0.33.0 refuses the specialised decode path ("Kimi K3 specialized decode does not
    support <reason>") outside these constraints (kimi-k3-and-vllm.md)."""
    if spec.engine.decode_backend != "latency_specialized":
        return []
    path = "spec.engine.decodeBackend"
    topo, sd = spec.topology, spec.speculative_decoding
    out: list[SpecError] = []
    if not PROFILES[topo.accelerator].megakernel_capable:
        out.append(SpecError(path, f"the megakernel decode path needs an SM100/SM103 GPU (gb300, gb200, b300, b200), "
                                   f"not {topo.accelerator}: use decodeBackend stock"))
    if topo.strategy != "tp" or expert_parallel:
        out.append(SpecError(path, f"the megakernel decode path refuses expert/data parallelism (strategy "
                                   f"{topo.strategy}): use strategy tp with tensorParallelSize 8 or 16, or decodeBackend stock"))
    elif tp not in (8, 16):
        out.append(SpecError("spec.topology.tensorParallelSize",
                             f"the megakernel decode path needs TP 8 or 16, not {tp}"))
    if topo.pipeline_parallel_size != 1:
        out.append(SpecError("spec.topology.pipelineParallelSize", "the megakernel decode path needs pipeline parallel 1"))
    if sd.method not in ("none", "dspark"):
        out.append(SpecError("spec.speculativeDecoding.method",
                             f"the megakernel decode path takes speculative decoding none or dspark, not {sd.method}"))
    if sd.method == "dspark" and (sd.num_speculative_tokens or 0) > 7:
        out.append(SpecError("spec.speculativeDecoding.numSpeculativeTokens",
                             f"the megakernel decode path takes at most 7 speculative tokens, not "
                             f"{sd.num_speculative_tokens}: use 7 with Inferact/Kimi-K3-DSpark"))
    if sd.adaptive_verification:
        out.append(SpecError("spec.speculativeDecoding.adaptiveVerification",
                             "the megakernel decode path refuses adaptive verification: set adaptiveVerification "
                             "false, or decodeBackend stock"))
    if spec.engine.enforce_eager:
        out.append(SpecError("spec.engine.enforceEager", "the megakernel decode path needs full decode CUDA graphs: "
                                                         "set enforceEager false, or decodeBackend stock"))
    out += _megakernel_engine_errors(spec, tp)
    return out


MEGAKERNEL_REFUSED_FLAGS = {
    "--enable-lora": "LoRA", "--enable-sleep-mode": "sleep mode", "--enable-dbo": "DBO micro-batching",
    "--use-replayssm": "ReplaySSM / RecoverSSM",
}
"""extraArgs flags vLLM 0.33.0's specialised decode refuses outright (its ``unsupported`` list)."""


def _extra_flag_values(extra_args: list[str]) -> list[tuple[int, str, str | None]]:
    """(index, flag as vLLM reads it, its value or None) for each flag in extraArgs;
    ``-O3``/``-O=3``/``-O 3`` read as ``--optimization-level 3`` (FlexibleArgumentParser)."""
    from kimik3.engine.args import normalize_flag
    out = []
    for i, arg in enumerate(extra_args):
        if not arg.startswith("-"):
            continue
        if arg.startswith("-O") and not arg.startswith("--") and arg != "-O":
            out.append((i, "--optimization-level", arg[3:] if arg[2:3] == "=" else arg[2:]))
            continue
        flag = "--optimization-level" if arg == "-O" else normalize_flag(arg)
        if "=" in arg:
            value: str | None = arg.split("=", 1)[1]
        elif i + 1 < len(extra_args) and not extra_args[i + 1].startswith("-"):
            value = extra_args[i + 1]
        else:
            value = None
        out.append((i, flag, value))
    return out


def _extra_args_shape_errors(spec: KimiK3DeploymentSpec, tp: int) -> list[SpecError]:
    """extraArgs that vLLM 0.33.0's ParallelConfig refuses for this shape (checked by tests/conformance)."""
    out = []
    for i, flag, value in _extra_flag_values(spec.engine.extra_args):
        if flag in ("--decode-context-parallel-size", "-dcp") and (
                not (value or "").isdigit() or int(value) < 1 or tp % int(value)):
            out.append(SpecError(f"spec.engine.extraArgs[{i}]",
                                 f"decode context parallel {value} must divide the tensor parallel size {tp} "
                                 f"(vLLM: tp_size must be divisible by dcp_size)"))
    return out


def _megakernel_engine_errors(spec: KimiK3DeploymentSpec, tp: int) -> list[SpecError]:
    """The rest of vLLM 0.33.0's ``unsupported`` list for the specialised decode path
    (vllm/models/kimi_k3/nvidia/specialized_decode/runtime), checked against that code by
    tests/conformance: FULL decode CUDA graphs, the V2 model runner, no AttnRes aux stream with
    speculative decoding, and no extraArgs that switch on what it refuses."""
    e = spec.engine
    out: list[SpecError] = []
    if e.cudagraph_mode == "PIECEWISE":
        out.append(SpecError("spec.engine.cudagraphMode",
                             "the megakernel decode path needs FULL decode CUDA graphs: use FULL_AND_PIECEWISE, "
                             "FULL_DECODE_ONLY or FULL, or decodeBackend stock"))
    speculative = spec.speculative_decoding.method != "none"
    for i, var in enumerate(e.env):
        if var.name == "VLLM_USE_V2_MODEL_RUNNER" and var.value != "1":
            out.append(SpecError(f"spec.engine.env[{i}]", "the megakernel decode path runs on the V2 model runner: "
                                                          "VLLM_USE_V2_MODEL_RUNNER must be 1 (or unset)"))
        if var.name == "VLLM_KIMI_K3_AUX_ATTN_RES_STREAM" and var.value != "0" and speculative:
            out.append(SpecError(f"spec.engine.env[{i}]", "the megakernel decode path refuses the AttnRes aux stream "
                                                          "with speculative decoding: unset VLLM_KIMI_K3_AUX_ATTN_RES_STREAM"))
    for i, flag, value in _extra_flag_values(e.extra_args):
        path = f"spec.engine.extraArgs[{i}]"
        why = None
        if flag in MEGAKERNEL_REFUSED_FLAGS and (value or "true").lower() not in ("false", "0"):
            why = MEGAKERNEL_REFUSED_FLAGS[flag]
        elif flag in ("--decode-context-parallel-size", "-dcp") and value not in ("1", str(tp)):
            why = f"decode context parallel {value} (it takes 1 or the TP size {tp})"
        elif flag == "--mamba-cache-dtype" and value not in ("auto", "bfloat16"):
            why = f"a KDA conv state in {value} (it keeps BF16: auto or bfloat16)"
        elif flag == "--mamba-ssm-cache-dtype" and value not in ("auto", "float32"):
            why = f"a KDA recurrent state in {value} (it keeps FP32: auto or float32)"
        elif flag == "--optimization-level" and value in ("0", "1") and e.cudagraph_mode is None:
            why = f"optimization level {value} (no FULL decode CUDA graphs; set cudagraphMode, or use -O2/-O3)"
        if why:
            out.append(SpecError(path, f"the megakernel decode path (vLLM 0.33.0) refuses {why}: "
                                       f"remove it, or use decodeBackend stock"))
    return out


def _speculative_errors(spec: KimiK3DeploymentSpec, tp: int, pp: int) -> list[SpecError]:
    sd = spec.speculative_decoding
    out: list[SpecError] = []
    if sd.method == "dspark" and pp > 1:
        out.append(SpecError("spec.speculativeDecoding.method",
                             "dspark does not work with pipeline parallelism (vllm#50098): set "
                             "topology.pipelineParallelSize to 1 or use another method"))
    if sd.method in ("dspark", "eagle3") and not sd.draft_model:
        out.append(SpecError("spec.speculativeDecoding.draftModel", f"{sd.method} needs draftModel"))
    if sd.method != "none" and sd.num_speculative_tokens is None:
        out.append(SpecError("spec.speculativeDecoding.numSpeculativeTokens",
                             "numSpeculativeTokens is required unless method is none"))
    if sd.adaptive_verification and sd.method != "dspark":
        out.append(SpecError("spec.speculativeDecoding.adaptiveVerification", "adaptiveVerification exists only for dspark"))
    if sd.method != "ngram" and (sd.prompt_lookup_min is not None or sd.prompt_lookup_max is not None):
        out.append(SpecError("spec.speculativeDecoding.method", "promptLookupMin/promptLookupMax apply to ngram only"))
    if sd.prompt_lookup_min and sd.prompt_lookup_max and sd.prompt_lookup_min > sd.prompt_lookup_max:
        out.append(SpecError("spec.speculativeDecoding.promptLookupMin", "promptLookupMin must be <= promptLookupMax"))
    if sd.draft_tensor_parallel_size not in (None, 1, tp):
        out.append(SpecError("spec.speculativeDecoding.draftTensorParallelSize",
                             f"draftTensorParallelSize must be 1 or the target's TP ({tp})"))
    return out
