"""Settings vLLM 0.33.0 changes without an error, for the specs the API can express.

``engine_overrides(spec, plan)`` returns one ``EngineOverride`` for each place where the engine,
given the arguments ``kimik3.engine.args`` renders for the spec, runs with another value than the
spec asks for, or runs the asked feature on part of the work only. Admission returns them with
the ``Admitted`` spec (``Admitted.overrides``); ``kimik3 validate`` prints them, the controller
writes them to ``status.engineOverrides`` and posts each as a Warning Event
``EngineSettingOverridden``. Each names the spec fields, the value vLLM will use, and the change
that avoids it.

Read in vLLM 0.33.0's own code (the pinned engine; each function below names its source), and
checked against it by tests/conformance/test_overrides_conformance.py, which drives vLLM's config
classes with the rendered arguments. Overrides vLLM 0.33 applies that the API cannot reach are
left out: a drafter checkpoint whose ``max_position_embeddings`` is below maxModelLen lowers
max_model_len (``VllmConfig._limit_max_model_len_to_draft``) only by what the checkpoint says, which
admission does not read; dynamic speculative decoding, KV connectors, pooling and encoder-decoder
models are not expressible.
"""

from __future__ import annotations

from kimik3.api.v1alpha1 import EngineOverride, KimiK3DeploymentSpec
from kimik3.topology.plan import GroupPlan

MEGAKERNEL_MAX_TOKENS = 64
"""Most tokens of one decode step the megakernel path runs (vLLM 0.33.0
``models/kimi_k3/nvidia/specialized_decode/runtime/providers.py``: ``PREPARED_MAX``, the largest of
its prepared ``BATCHES``); ``SpecializedDecode.plan`` (``runtime/decode.py``) sends any wider step to
the stock forward."""

CAPTURE_CEILING_SM100 = 1024
CAPTURE_CEILING_OTHER = 512
"""Platform ceiling of vLLM 0.33's default CUDA-graph capture, tokens per step
(``VllmConfig._set_cudagraph_sizes``: 1024 on the SM100 family, 512 elsewhere)."""


def _e(name: str) -> str:
    return f"spec.engine.{name}"


_K = "spec.speculativeDecoding.numSpeculativeTokens"


def all2all_naive(spec: KimiK3DeploymentSpec, plan: GroupPlan) -> list[EngineOverride]:
    """``--all2all-backend naive`` becomes ``allgather_reducescatter``: vLLM 0.33.0
    ``config/parallel.py`` ``ParallelConfig._validate_parallel_config`` ("The 'naive' all2all backend
    has been removed. Falling back to 'allgather_reducescatter'", a log line only). The operator
    renders the backend with expert parallelism only."""
    if not (plan.expert_parallel and spec.engine.all2all_backend == "naive"):
        return []
    return [EngineOverride(
        fields=[_e("all2allBackend")], vllm_uses="all2all_backend allgather_reducescatter",
        message="vLLM 0.33 removed the naive all-to-all backend and runs allgather_reducescatter instead",
        avoid="set engine.all2allBackend to allgather_reducescatter (the same collective), or leave it unset "
              "for flashinfer_nvlink_one_sided on NVLink")]


def eager_drops_cudagraph_mode(spec: KimiK3DeploymentSpec, plan: GroupPlan) -> list[EngineOverride]:
    """``--enforce-eager`` with ``cudagraph_mode`` set: vLLM 0.33.0 ``config/vllm.py``
    ``VllmConfig.__post_init__`` ("Enforce eager set, disabling torch.compile, CUDAGraphs") sets
    compilation mode NONE and cudagraph_mode NONE, whatever cudagraph_mode says."""
    e = spec.engine
    if not (e.enforce_eager and e.cudagraph_mode):
        return []
    return [EngineOverride(
        fields=[_e("enforceEager"), _e("cudagraphMode")], vllm_uses="cudagraph_mode NONE, no torch.compile",
        message=f"enforceEager turns CUDA graphs off: cudagraphMode {e.cudagraph_mode} is not used",
        avoid="unset engine.cudagraphMode (eager), or set engine.enforceEager to false to keep the graphs")]


def dspark_active_seqs(spec: KimiK3DeploymentSpec, plan: GroupPlan) -> list[EngineOverride]:
    """DSpark lowers ``max_num_active_seqs`` below ``max_num_seqs`` when one step cannot hold every
    request's draft block: vLLM 0.33.0 ``config/vllm.py`` ``VllmConfig._set_max_num_scheduled_tokens``
    ("Overriding max_num_active_seqs from S to maxNumBatchedTokens // num_lookahead_tokens").
    ``num_lookahead_tokens`` (``VllmConfig.num_lookahead_tokens``) is numSpeculativeTokens for an
    anchor-sampling DSpark drafter, the default when its config.json does not set
    ``sample_from_anchor: false`` (then one more: the cap is lower still)."""
    sd, e = spec.speculative_decoding, spec.engine
    if sd.method != "dspark" or sd.num_speculative_tokens is None:
        return []
    active = e.max_num_batched_tokens // sd.num_speculative_tokens
    if active >= e.max_num_seqs:
        return []
    return [EngineOverride(
        fields=[_e("maxNumSeqs"), _e("maxNumBatchedTokens"), _K], vllm_uses=f"max_num_active_seqs {active}",
        message=f"DSpark drafts {sd.num_speculative_tokens} query tokens per request inside maxNumBatchedTokens "
                f"{e.max_num_batched_tokens}: vLLM runs at most {active} requests at once, not maxNumSeqs "
                f"{e.max_num_seqs}",
        avoid=f"raise engine.maxNumBatchedTokens to at least {e.max_num_seqs * sd.num_speculative_tokens}, or lower "
              f"engine.maxNumSeqs to {active}")]


def decode_query_len(spec: KimiK3DeploymentSpec) -> int:
    """Tokens of one request in a decode step: 1 + numSpeculativeTokens (vLLM 0.33.0
    ``VllmConfig.uniform_decode_query_len``), 1 without speculative decoding."""
    sd = spec.speculative_decoding
    return 1 + (sd.num_speculative_tokens or 0) if sd.method != "none" else 1


def max_cudagraph_capture_size(max_num_seqs: int, max_num_batched_tokens: int, query_len: int,
                               sm100_family: bool) -> int:
    """The largest decode step, tokens, vLLM 0.33.0 captures a CUDA graph for when the compilation
    config names no capture sizes (what the operator renders): ``VllmConfig._set_cudagraph_sizes``.
    Its ceiling is min(maxNumSeqs x query_len x 2, 1024 on SM100 / 512 elsewhere,
    maxNumBatchedTokens); the sizes are 1, 2, 4, multiples of 8 below 256, multiples of 16 from 256,
    maxNumBatchedTokens when it fits, and the uniform decode sizes (request counts x query_len)."""
    platform = CAPTURE_CEILING_SM100 if sm100_family else CAPTURE_CEILING_OTHER
    ceiling = min(max_num_seqs * query_len * 2, platform)
    if query_len > 1:
        reqs = min(max_num_seqs, platform)
        counts = {n for n in (1, 2, 4) if n <= reqs} | set(range(8, min(reqs + 1, 256), 8)) | \
            set(range(256, reqs + 1, 16)) | {reqs}
        uniform = {n * query_len for n in counts if n * query_len <= ceiling}
    else:
        uniform = {max_num_seqs} if max_num_seqs <= ceiling else set()
    capped = min(max_num_batched_tokens, ceiling)
    sizes = {n for n in (1, 2, 4) if n <= capped}
    if capped >= 8:
        sizes |= set(range(8, min(capped + 1, 256), 8))
    if capped >= 256:
        sizes |= set(range(256, capped + 1, 16))
    if max_num_batched_tokens <= capped:
        sizes.add(max_num_batched_tokens)
    sizes |= {u for u in uniform if u <= max_num_batched_tokens}
    return max(sizes)


def cudagraph_capture_ceiling(spec: KimiK3DeploymentSpec, plan: GroupPlan) -> list[EngineOverride]:
    """Decode steps wider than the largest captured CUDA graph run without one: vLLM 0.33.0
    ``config/vllm.py`` ``VllmConfig._set_cudagraph_sizes`` caps the capture at 1024 tokens on SM100
    (512 on H200) and at maxNumBatchedTokens ("Larger uniform decode batches fall back to eager
    execution"; no log line). Only when graphs are on (not enforceEager)."""
    e = spec.engine
    if e.enforce_eager:
        return []
    q = decode_query_len(spec)
    top = max_cudagraph_capture_size(e.max_num_seqs, e.max_num_batched_tokens, q, plan.profile.megakernel_capable)
    if top >= e.max_num_seqs * q:
        return []
    per_request = f" ({q} tokens per request)" if q > 1 else ""
    fields = [_e("maxNumSeqs")] + ([_K] if q > 1 else []) + \
        ([_e("maxNumBatchedTokens")] if top == e.max_num_batched_tokens else [])
    return [EngineOverride(
        fields=fields, vllm_uses=f"max_cudagraph_capture_size {top}",
        message=f"vLLM captures CUDA graphs for decode steps of at most {top} tokens{per_request} on "
                f"{plan.profile.name}: steps of more than {top // q} requests run without CUDA graphs, though "
                f"maxNumSeqs is {e.max_num_seqs}",
        avoid=f"lower engine.maxNumSeqs to {top // q} to keep every decode step in a CUDA graph"
              + (", or draft fewer tokens" if q > 1 else ""))]


def megakernel_step_width(spec: KimiK3DeploymentSpec, plan: GroupPlan) -> list[EngineOverride]:
    """The megakernel decode path runs decode steps of at most ``MEGAKERNEL_MAX_TOKENS`` tokens;
    wider ones run the stock decode (vLLM 0.33.0 ``models/kimi_k3/nvidia/specialized_decode/runtime/
    decode.py`` ``SpecializedDecode.plan``: "token counts without prepared providers (above 64 ...)"),
    without a log line. maxNumSeqs is kept."""
    e = spec.engine
    if e.decode_backend != "latency_specialized":
        return []
    q = decode_query_len(spec)
    if e.max_num_seqs * q <= MEGAKERNEL_MAX_TOKENS:
        return []
    fits = MEGAKERNEL_MAX_TOKENS // q
    per_request = f" ({q} tokens per request)" if q > 1 else ""
    return [EngineOverride(
        fields=[_e("decodeBackend"), _e("maxNumSeqs")] + ([_K] if q > 1 else []),
        vllm_uses=f"the megakernel for decode steps of up to {MEGAKERNEL_MAX_TOKENS} tokens, the stock decode above",
        message=f"decode steps of more than {fits} requests{per_request} run the stock decode path, though "
                f"maxNumSeqs is {e.max_num_seqs}",
        avoid=f"lower engine.maxNumSeqs to {fits} to run every decode step on the megakernel (fewer requests "
              f"per group), or keep it and accept the stock decode under load")]


CHECKS = (all2all_naive, eager_drops_cudagraph_mode, dspark_active_seqs, cudagraph_capture_ceiling,
          megakernel_step_width)
"""Every override check, in the order they are reported."""


def engine_overrides(spec: KimiK3DeploymentSpec, plan: GroupPlan) -> list[EngineOverride]:
    """Every setting vLLM 0.33.0 will change or narrow for this admitted spec (empty when none)."""
    return [o for check in CHECKS for o in check(spec, plan)]


def describe(override: EngineOverride) -> str:
    """One line for an Event or the CLI: ``<fields>: <message>; vLLM uses <value>; to avoid it: <change>``."""
    return (f"{', '.join(override.fields)}: {override.message}; vLLM 0.33 uses {override.vllm_uses}; "
            f"to avoid it: {override.avoid}")
