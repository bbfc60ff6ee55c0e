"""vLLM 0.33.0's specialised ("megakernel", ``decodeBackend: latency_specialized``) decode path.

vLLM refuses it ("Kimi K3 specialized decode does not support <reason>") outside these
constraints (vllm/models/kimi_k3/nvidia/specialized_decode/runtime, its ``unsupported`` list;
kimi-k3-and-vllm.md; checked against that code by tests/conformance): an SM100/SM103 GPU; strategy
tp with TP 8 or 16, no pipeline or expert parallelism; speculative decoding none or dspark with at
most 7 tokens and no adaptive verification; FULL decode CUDA graphs (no enforceEager, no
PIECEWISE, no -O0/-O1 without a cudagraphMode); the V2 model runner; no AttnRes aux stream with
speculative decoding; none of the features it lists (LoRA, sleep mode, DBO, ReplaySSM,
decode context parallel other than 1 or TP, KDA states in other dtypes). Every check here passes
a spec whose decodeBackend is stock.
"""

from __future__ import annotations

from kimik3.admission.extra_args import PARSED_ARGV, flag_values
from kimik3.admission.rules import Candidate, Rule, Table, example, refuse
from kimik3.api.errors import SpecError
from kimik3.api.v1alpha1 import MEGAKERNEL_ACCELERATORS
from kimik3.topology.plan import expert_parallel, profile, tensor_parallel_size

BACKEND = "spec.engine.decodeBackend"
MAX_SPECULATIVE_TOKENS = 7
"""Most draft tokens the specialised path verifies per step (Inferact/Kimi-K3-DSpark drafts 7)."""
REFUSED_FLAGS = {
    "--enable-lora": "LoRA", "--enable-sleep-mode": "sleep mode", "--enable-dbo": "DBO micro-batching",
    "--use-replayssm": "ReplaySSM / RecoverSSM",
}
"""extraArgs flags the specialised decode path refuses outright (its ``unsupported`` list)."""


def _on(c: Candidate) -> bool:
    return c.spec.engine.decode_backend == "latency_specialized"


def megakernel_gpu(c: Candidate) -> list[SpecError]:
    return refuse(_on(c) and not profile(c.topology).megakernel_capable, BACKEND,
                  f"the megakernel decode path needs an SM100/SM103 GPU ({', '.join(MEGAKERNEL_ACCELERATORS)}), "
                  f"not {c.topology.accelerator}: use decodeBackend stock")


def megakernel_shape(c: Candidate) -> list[SpecError]:
    if not _on(c):
        return []
    topo = c.topology
    out = []
    if topo.strategy != "tp" or expert_parallel(topo):
        out.append(SpecError(BACKEND, f"the megakernel decode path refuses expert/data parallelism (strategy "
                                      f"{topo.strategy}): use strategy tp with tensorParallelSize 8 or 16, or "
                                      f"decodeBackend stock"))
    elif tensor_parallel_size(topo) not in (8, 16):
        out.append(SpecError("spec.topology.tensorParallelSize",
                             f"the megakernel decode path needs TP 8 or 16, not {tensor_parallel_size(topo)}"))
    if topo.pipeline_parallel_size != 1:
        out.append(SpecError("spec.topology.pipelineParallelSize",
                             "the megakernel decode path needs pipeline parallel 1"))
    return out


def megakernel_speculative(c: Candidate) -> list[SpecError]:
    if not _on(c):
        return []
    sd = c.spec.speculative_decoding
    out = []
    if sd.method not in ("none", "dspark"):
        out.append(SpecError("spec.speculativeDecoding.method",
                             f"the megakernel decode path takes speculative decoding none or dspark, not {sd.method}"))
    if sd.method == "dspark" and (sd.num_speculative_tokens or 0) > MAX_SPECULATIVE_TOKENS:
        out.append(SpecError("spec.speculativeDecoding.numSpeculativeTokens",
                             f"the megakernel decode path takes at most {MAX_SPECULATIVE_TOKENS} speculative tokens, "
                             f"not {sd.num_speculative_tokens}: use 7 with Inferact/Kimi-K3-DSpark"))
    if sd.adaptive_verification:
        out.append(SpecError("spec.speculativeDecoding.adaptiveVerification",
                             "the megakernel decode path refuses adaptive verification: set adaptiveVerification "
                             "false, or decodeBackend stock"))
    return out


def megakernel_no_enforce_eager(c: Candidate) -> list[SpecError]:
    return refuse(_on(c) and c.spec.engine.enforce_eager, "spec.engine.enforceEager",
                  "the megakernel decode path needs full decode CUDA graphs: set enforceEager false, or "
                  "decodeBackend stock")


def megakernel_full_decode_graphs(c: Candidate) -> list[SpecError]:
    return refuse(_on(c) and c.spec.engine.cudagraph_mode == "PIECEWISE", "spec.engine.cudagraphMode",
                  "the megakernel decode path needs FULL decode CUDA graphs: use FULL_AND_PIECEWISE, "
                  "FULL_DECODE_ONLY or FULL, or decodeBackend stock")


def megakernel_v2_model_runner(c: Candidate) -> list[SpecError]:
    if not _on(c):
        return []
    return [SpecError(f"spec.engine.env[{i}]", "the megakernel decode path runs on the V2 model runner: "
                                               "VLLM_USE_V2_MODEL_RUNNER must be 1 (or unset)")
            for i, var in enumerate(c.spec.engine.env) if var.name == "VLLM_USE_V2_MODEL_RUNNER" and var.value != "1"]


def megakernel_no_aux_stream_with_speculation(c: Candidate) -> list[SpecError]:
    if not _on(c) or c.spec.speculative_decoding.method == "none":
        return []
    return [SpecError(f"spec.engine.env[{i}]", "the megakernel decode path refuses the AttnRes aux stream with "
                                               "speculative decoding: unset VLLM_KIMI_K3_AUX_ATTN_RES_STREAM")
            for i, var in enumerate(c.spec.engine.env)
            if var.name == "VLLM_KIMI_K3_AUX_ATTN_RES_STREAM" and var.value != "0"]


def megakernel_refused_extra_args(c: Candidate) -> list[SpecError]:
    if not _on(c):
        return []
    e, tp = c.spec.engine, tensor_parallel_size(c.topology)
    out = []
    for i, flag, value in flag_values(e.extra_args):
        why = None
        if flag in REFUSED_FLAGS and (value or "true").lower() not in ("false", "0"):
            why = REFUSED_FLAGS[flag]
        elif flag in ("--decode-context-parallel-size", "-dcp") and value not in ("1", str(tp)):
            why = f"decode context parallel {value} (it takes 1 or the TP size {tp})"
        elif flag == "--mamba-cache-dtype" and value not in ("auto", "bfloat16"):
            why = f"a KDA conv state in {value} (it keeps BF16: auto or bfloat16)"
        elif flag == "--mamba-ssm-cache-dtype" and value not in ("auto", "float32"):
            why = f"a KDA recurrent state in {value} (it keeps FP32: auto or float32)"
        elif flag == "--optimization-level" and value in ("0", "1") and e.cudagraph_mode is None:
            why = f"optimization level {value} (no FULL decode CUDA graphs; set cudagraphMode, or use -O2/-O3)"
        if why:
            out.append(SpecError(f"spec.engine.extraArgs[{i}]", f"the megakernel decode path (vLLM 0.33.0) refuses "
                                                                f"{why}: remove it, or use decodeBackend stock"))
    return out


ON = {"decodeBackend": "latency_specialized"}
DSPARK7 = {"method": "dspark", "draftModel": "/models/Kimi-K3-DSpark", "numSpeculativeTokens": 7}
"""DSpark with the 7-token drafter, given as its folder in the weights volume (the examples' pvc source is offline)."""

MEGAKERNEL = Table("megakernel", (
    Rule(megakernel_gpu, example(engine=ON, topology={"accelerator": "h200", "tensorParallelSize": 16}),
         cel=("megakernel-gpu",)),
    Rule(megakernel_shape, example(engine=ON, topology={"strategy": "dep", "dataParallelSize": 16}),
         cel=("megakernel-shape",)),
    Rule(megakernel_speculative, example(engine=ON, speculativeDecoding={**DSPARK7, "numSpeculativeTokens": 8}),
         cel=("megakernel-speculative",)),
    Rule(megakernel_no_enforce_eager, example(engine={**ON, "enforceEager": True}),
         cel=("megakernel-no-enforce-eager",)),
    Rule(megakernel_full_decode_graphs, example(engine={**ON, "cudagraphMode": "PIECEWISE"}),
         cel=("megakernel-no-piecewise",)),
    Rule(megakernel_v2_model_runner,
         example(engine={**ON, "env": [{"name": "VLLM_USE_V2_MODEL_RUNNER", "value": "0"}]}),
         cel=("megakernel-v2-runner",)),
    Rule(megakernel_no_aux_stream_with_speculation,
         example(engine={**ON, "env": [{"name": "VLLM_KIMI_K3_AUX_ATTN_RES_STREAM", "value": "1"}]},
                 speculativeDecoding=DSPARK7),
         cel=("megakernel-no-aux-stream",)),
    Rule(megakernel_refused_extra_args, example(engine={**ON, "extraArgs": ["--enable-lora"]}),
         operator_only=PARSED_ARGV),
))
