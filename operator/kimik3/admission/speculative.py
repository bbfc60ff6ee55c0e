"""Speculative decoding settings vLLM 0.33 takes (its ``SpeculativeConfig``; kimi-k3-and-vllm.md).

A drafter checkpoint for dspark/eagle3, a token count unless the method is none, adaptive
verification for dspark only, prompt lookup for ngram only, a drafter TP of 1 or the target's,
and no dspark under pipeline parallelism (vllm#50098).
"""

from __future__ import annotations

from kimik3.admission.rules import Candidate, Rule, Table, example, refuse
from kimik3.api.errors import SpecError
from kimik3.topology.plan import tensor_parallel_size

PATH = "spec.speculativeDecoding"


def dspark_without_pipeline_parallel(c: Candidate) -> list[SpecError]:
    return refuse(c.spec.speculative_decoding.method == "dspark" and c.topology.pipeline_parallel_size > 1,
                  f"{PATH}.method", "dspark does not work with pipeline parallelism (vllm#50098): set "
                                    "topology.pipelineParallelSize to 1 or use another method")


def draft_model_required(c: Candidate) -> list[SpecError]:
    sd = c.spec.speculative_decoding
    return refuse(sd.method in ("dspark", "eagle3") and not sd.draft_model, f"{PATH}.draftModel",
                  f"{sd.method} needs draftModel")


def speculative_tokens_required(c: Candidate) -> list[SpecError]:
    sd = c.spec.speculative_decoding
    return refuse(sd.method != "none" and sd.num_speculative_tokens is None, f"{PATH}.numSpeculativeTokens",
                  "numSpeculativeTokens is required unless method is none")


def adaptive_verification_dspark_only(c: Candidate) -> list[SpecError]:
    sd = c.spec.speculative_decoding
    return refuse(sd.adaptive_verification and sd.method != "dspark", f"{PATH}.adaptiveVerification",
                  "adaptiveVerification exists only for dspark")


def prompt_lookup_ngram_only(c: Candidate) -> list[SpecError]:
    sd = c.spec.speculative_decoding
    return refuse(sd.method != "ngram" and (sd.prompt_lookup_min is not None or sd.prompt_lookup_max is not None),
                  f"{PATH}.method", "promptLookupMin/promptLookupMax apply to ngram only")


def prompt_lookup_min_at_most_max(c: Candidate) -> list[SpecError]:
    low, high = c.spec.speculative_decoding.prompt_lookup_min, c.spec.speculative_decoding.prompt_lookup_max
    return refuse(low is not None and high is not None and low > high, f"{PATH}.promptLookupMin",
                  "promptLookupMin must be <= promptLookupMax")


def draft_tp_one_or_target(c: Candidate) -> list[SpecError]:
    draft_tp, tp = c.spec.speculative_decoding.draft_tensor_parallel_size, tensor_parallel_size(c.topology)
    return refuse(draft_tp not in (None, 1, tp), f"{PATH}.draftTensorParallelSize",
                  f"draftTensorParallelSize must be 1 or the target's TP ({tp})")


DSPARK = {"method": "dspark", "draftModel": "/models/Kimi-K3-DSpark", "numSpeculativeTokens": 7}
"""DSpark with the 7-token drafter, given as its folder in the weights volume (the examples' pvc source is offline)."""

SPECULATIVE = Table("speculative", (
    Rule(dspark_without_pipeline_parallel,
         example(topology={"tensorParallelSize": 4, "pipelineParallelSize": 2}, speculativeDecoding=DSPARK),
         cel=("dspark-no-pipeline-parallel",)),
    Rule(draft_model_required, example(speculativeDecoding={"method": "eagle3", "numSpeculativeTokens": 3}),
         cel=("draft-model-required",)),
    Rule(speculative_tokens_required, example(speculativeDecoding={"method": "mtp"}),
         cel=("speculative-tokens-required",)),
    Rule(adaptive_verification_dspark_only,
         example(speculativeDecoding={"method": "mtp", "numSpeculativeTokens": 2, "adaptiveVerification": True}),
         cel=("adaptive-verification-dspark-only",)),
    Rule(prompt_lookup_ngram_only,
         example(speculativeDecoding={"method": "mtp", "numSpeculativeTokens": 2, "promptLookupMax": 4}),
         cel=("prompt-lookup-ngram-only",)),
    Rule(prompt_lookup_min_at_most_max,
         example(speculativeDecoding={"method": "ngram", "numSpeculativeTokens": 4, "promptLookupMin": 5,
                                      "promptLookupMax": 3}),
         cel=("prompt-lookup-min-le-max",)),
    Rule(draft_tp_one_or_target, example(speculativeDecoding={**DSPARK, "draftTensorParallelSize": 4}),
         cel=("draft-tp-one-or-target",)),
))
