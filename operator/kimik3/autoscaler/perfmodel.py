"""Performance model of Kimi K3 decode on one engine group: a MODEL, calibrated to published figures.

Pure functions and frozen data only (no I/O, no clock, no randomness unless a ``random.Random``
is passed in), so the engine simulator (``kimik3_dev.sim.engine``) and a fleet/trace simulator
(issue 4) share the same numbers.

The model
=========
One engine step (one forward pass of the target model over the running batch, plus the drafter
under speculative decoding) takes::

    step(n, p) = a + m * coverage(n) + b * n + p / prefill_rate          [seconds]

- ``n``: tokens the step verifies = running decode sequences x (1 + k), k = speculative tokens
  (a DSpark step verifies the current token and its k drafts for every sequence);
- ``a``: the latency floor (kernel launches, all-reduce / all-to-all, the drafter). At batch 1
  it is almost the whole step: Kimi K3 decode at batch 1 is latency-bound, which is what the
  megakernel path attacks (130 us / 23 kernels -> 69 us / 13 kernels per layer);
- ``m * coverage(n)``: streaming the routed-expert weights the batch touches.
  ``coverage(n) = 1 - (1 - 16/896)^n`` is the expected share of the 896 routed experts that
  ``n`` tokens routed top-16 touch (uniform routing assumed); ``m`` = time to stream all routed
  experts once from HBM = ROUTED_EXPERT_BYTES / (GPUs x HBM bandwidth x BW_EFFICIENCY).
  This term makes latency rise steeply from batch 1 to ~100 verified tokens, then flatten;
- ``b * n``: compute that grows linearly with tokens. ``b`` is chosen so that the saturated
  decode throughput equals DECODE_TOKENS_PER_GPU_S per GPU (see the table);
- ``p / prefill_rate``: prefill tokens scheduled into the same step (chunked prefill).

``a`` is solved per configuration so that the batch-1 figure is met exactly:
``a = 1/figure_step - m*coverage(n1) - b*n1`` with n1 = 1 + k. Tokens per step = 1 + accepted;
accepted drafts follow a chain: draft position i (0-based) is accepted with probability p^(i+1),
so the acceptance length is ``AL(k) = 1 + p + p^2 + ... + p^k``; p is solved from the published
AL at k = 7. Per-user decode speed = tokens per step / step time; TPOT = its inverse.
TTFT = queueing + prompt_tokens / prefill_rate + the step that emits the first token.

Reading the published figures (kimi-k3-and-vllm.md, "Measured decode speed")
===========================================================================
- 111 / 118 tok/s: TP8 / TP16, stock decode, no speculation, batch 1 -> step = 1/111, 1/118 s.
- 331 / 370 tok/s: TP8 / TP16, stock decode, DSpark (7 drafts), batch 1, on the blog's workload.
  That workload's acceptance length is not given; we infer it from the per-layer figure:
  a stock DSpark step on TP16 = 93 layers x 130 us = 12.09 ms, so AL_BLOG = 370 x 12.09 ms = 4.47
  (between Dynamo's 4.26 and DSpark's 4.7 on code). TP8's step = AL_BLOG / 331 = 13.5 ms.
- 423 tok/s "megakernel decode path, a 1.68x gain" and "batch 1 on 16 GB300 > 840 tok/s with
  DSpark at synthetic acceptance length 6" (same news item): we read both as TP16 (16 GB300),
  megakernel + DSpark. 840 tok/s at AL 6 gives a megakernel DSpark step of 6/840 = 7.14 ms, i.e.
  12.09 / 7.14 = 1.69x faster steps than the stock path: the "1.68x gain" (cross-checked by a
  test). 423 tok/s at that step time means the news workload accepted AL_NEWS = 423 x 7.14 ms =
  3.02 tokens per step; at that AL the stock path gives ~250 tok/s, and 423/250 = 1.69.
  (423 is NOT TP8 + megakernel at the blog's workload: that would be a 1.28x gain over 331.)
  The megakernel shrinks the latency floor ``a`` by MK_FLOOR_FACTOR (solved from the TP16 points,
  0.50; the per-layer figure alone would give 69/130 = 0.53); it is applied to every megakernel
  configuration (TP8, and no speculation), which nobody has published: a model assumption.

Constants (every number the model uses)
=======================================
======================== ============ ===================================================================
constant                 value        source / meaning
======================== ============ ===================================================================
TOKS_STOCK_NOSPEC[8]     111 tok/s    kimi-k3-and-vllm.md: GB300, TP8, no speculation, batch 1
TOKS_STOCK_NOSPEC[16]    118 tok/s    kimi-k3-and-vllm.md: GB300, TP16, no speculation (TPOT ~8.4-8.5 ms)
TOKS_STOCK_DSPARK[8]     331 tok/s    kimi-k3-and-vllm.md: GB300, TP8 + DSpark, batch 1 (blog workload)
TOKS_STOCK_DSPARK[16]    370 tok/s    kimi-k3-and-vllm.md: GB300, TP16 + DSpark, batch 1 (blog workload)
TOKS_MK_NEWS             423 tok/s    kimi-k3-and-vllm.md: megakernel path (news 2026-10-18); read as TP16 + DSpark
MK_GAIN_PUBLISHED        1.68         same news item: the megakernel's gain (checked, not used)
TOKS_MK_TP16_AL6         840 tok/s    same news item: 16 GB300, DSpark, synthetic AL 6, batch 1 (a lower bound)
LAYER_US_STOCK / _MK     130 / 69 us  kimi-k3-and-vllm.md: one decoder layer, stock vs specialised path
NUM_LAYERS               93           kimi-k3-and-vllm.md: 69 KDA + 24 MLA decoder layers
ROUTED_EXPERTS / TOP_K   896 / 16     kimi-k3-and-vllm.md: MoE routing
AL_DSPARK["code"]        4.7          kimi-k3-and-vllm.md: DSpark acceptance on code (taken at k = 7)
AL_DSPARK["creative"]    2.6          kimi-k3-and-vllm.md: DSpark acceptance on creative writing (k = 7)
AL_DSPARK["chat"]        4.26         kimi-k3-and-vllm.md: Dynamo's measurement with 7 drafts (default)
AL_DSPARK["blog"]        4.47         derived above from 370 tok/s x 93 x 130 us
AL_DSPARK["news"]        3.02         derived above from 423 tok/s x 6/840 s
ROUTED_EXPERT_BYTES      1.4e12 B     assumption: ~1.5 TB checkpoint (reference) minus ~0.1 TB of BF16
                                      non-expert weights (attention, shared experts, embeddings)
HBM_BYTES_PER_S          8e12 (gb300, gb200, b300, b200), 4.8e12 (h200): NVIDIA datasheets
BW_EFFICIENCY            0.75         assumption: achieved share of HBM bandwidth streaming MXFP4 experts
DECODE_TOKENS_PER_GPU_S  3593 tok/s   vLLM blog "Driving vLLM WideEP and large-scale serving toward
                                      maturity on Blackwell": 10.1k decode tok/s per GB200 GPU for
                                      DeepSeek-style MoE (37B active), scaled by 37/104 to K3's 104B active
PREFILL_TOKENS_PER_GPU_S 9323 tok/s   same blog: 26.2k prefill tok/s per GPU, scaled by 37/104
COMPUTE_FACTOR           1.0 (Blackwell), 0.44 (h200): dense FP8 peak vs B200/GB200 (1.98 vs 4.5 PFLOPS)
LATENCY_FACTOR           1.0 (Blackwell), 1.3 (h200): assumption, no published K3 figure on H200
DP_EP_LATENCY_FACTOR     1.2          assumption: DEP / DP+EP batch-1 floor vs TP of the same GPUs
                                      (recipes: "per-user speed at batch 1 is below the TP recipes")
P_OTHER_METHODS          eagle3 0.70, mtp 0.80, ngram 0.50: assumed per-position acceptance; no
                                      published K3 figure (a model assumption)
KV_BYTES_PER_TOKEN       13824 B      24 MLA layers x (512 latent + 64 rope) x 1 byte (fp8), replicated
                                      on every TP rank (vLLM's MLA cache); KDA state is per sequence
KDA_STATE_BYTES_PER_SEQ  2.3e8 B      assumption: 69 KDA layers x 64 heads x 128 x 128 x 4 B (fp32), / TP
KDA_CONV_KERNEL          4            assumption: KDA's short convolution kernel (``short_conv_kernel_size``, vLLM's
                                      default in ``kda_state_shape``; the K3 config's value was not read)
KV_BLOCK_ALIGNMENT       128 tokens   vLLM 0.33.0 ``Platform._align_hybrid_block_size``: a hybrid MLA model's
                                      block size is a multiple of 128 (TRTLLM/FlashInfer MLA decode kernels);
                                      the K3 recipe's prefix-match unit on Blackwell (gateway-and-routing.md)
HOST_TO_GPU_BYTES_PER_S  225e9 B/s    GB300/GB200: NVLink-C2C, 900 GB/s bidirectional per Grace CPU, its 2 GPUs
                                      sharing 450 GB/s host-to-GPU; 64e9 (PCIe Gen5 x16) on HGX nodes
                                      (``kimik3.engine.kvcache``: a host-tier block's load instead of its prefill)
======================== ============ ===================================================================

The prefix cache (``kv_cache_blocks``)
======================================
How vLLM 0.33 lays K3's prefix cache out in blocks, on the GPUs and in the host tier of
``spec.engine.kvOffload``, is ``kimik3.engine.kvcache`` (``kv_blocks``): the render of the endpoint
picker's configuration reads the same figures. A block found in the host tier costs its copy back
(``kvcache.host_load_s``, NVLink-C2C on GB300) instead of its prefill.

Shapes without a published figure (TP other than 8/16, PP > 1, DEP, TP-DP, other accelerators)
use the nearest TP figure by GPU count (log-interpolated between 8 and 16 GPUs, clamped outside),
times the factors above. They are extrapolations of the model, not measurements.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field, replace
from typing import Any

from kimik3.engine import kvcache
from kimik3.engine.kvcache import (KDA_HEAD_DIM, KDA_HEADS, KDA_LAYERS, MLA_BYTES_PER_TOKEN_LAYER,
                                   MLA_LAYERS, NUM_LAYERS, KVBlocks, host_load_s)

# ------------------------------------------------------------------ published figures -------
TOKS_STOCK_NOSPEC: dict[int, float] = {8: 111.0, 16: 118.0}
"""Batch-1 tok/s per user, GB300, stock decode, no speculation, by TP (kimi-k3-and-vllm.md)."""
TOKS_STOCK_DSPARK: dict[int, float] = {8: 331.0, 16: 370.0}
"""Batch-1 tok/s per user, GB300, stock decode + DSpark (7 drafts), blog workload, by TP."""
TOKS_MK_NEWS = 423.0
"""Batch-1 tok/s per user, megakernel path (news of 2026-10-18); read as TP16 + DSpark, news workload."""
MK_GAIN_PUBLISHED = 1.68
"""The news item's gain of the megakernel path over stock (a cross-check of the model, not an input)."""
TOKS_MK_TP16_AL6 = 840.0
"""Batch-1 tok/s per user on 16 GB300, megakernel + DSpark at synthetic acceptance length 6 ("> 840")."""
SYNTHETIC_AL = 6.0
LAYER_US_STOCK = 130.0
"""Microseconds per decoder layer, stock decode path (kimi-k3-and-vllm.md)."""
LAYER_US_MK = 69.0
"""Microseconds per decoder layer, specialised (megakernel) decode path."""
ROUTED_EXPERTS = 896
EXPERTS_PER_TOKEN = 16
ACTIVE_PARAMS = 104e9
DSPARK_CALIBRATION_TOKENS = 7
"""Speculative tokens of the published DSpark figures (Inferact/Kimi-K3-DSpark, Dynamo's 7 drafts)."""

# ------------------------------------------------------------------ derived from them -------
STEP_STOCK_TP16_DSPARK = NUM_LAYERS * LAYER_US_STOCK * 1e-6
"""12.09 ms: a stock DSpark step on TP16 (93 layers x 130 us)."""
AL_BLOG = TOKS_STOCK_DSPARK[16] * STEP_STOCK_TP16_DSPARK
"""4.47: acceptance length of the workload behind 331/370 tok/s (inferred, see module docstring)."""
STEP_MK_TP16_DSPARK = SYNTHETIC_AL / TOKS_MK_TP16_AL6
"""7.14 ms: a megakernel DSpark step on TP16 (840 tok/s at AL 6)."""
AL_NEWS = TOKS_MK_NEWS * STEP_MK_TP16_DSPARK
"""3.02: acceptance length of the workload behind 423 tok/s (inferred)."""

AL_DSPARK: dict[str, float] = {
    "code": 4.7,
    "creative": 2.6,
    "chat": 4.26,
    "blog": AL_BLOG,
    "news": AL_NEWS,
}
"""DSpark acceptance length (tokens per step, bonus token included) at 7 drafts, by workload."""
DEFAULT_WORKLOAD = "chat"
"""Dynamo's measured 4.26 with 7 drafts: a measured figure on a general mix."""

# ------------------------------------------------------------------ hardware & assumptions --
ROUTED_EXPERT_BYTES = 1.4e12
HBM_BYTES_PER_S: dict[str, float] = {"gb300": 8e12, "gb200": 8e12, "b300": 8e12, "b200": 8e12, "h200": 4.8e12}
BW_EFFICIENCY = 0.75
DECODE_TOKENS_PER_GPU_S = 10_100 * 37 / 104
PREFILL_TOKENS_PER_GPU_S = 26_200 * 37 / 104
COMPUTE_FACTOR: dict[str, float] = {"gb300": 1.0, "gb200": 1.0, "b300": 1.0, "b200": 1.0, "h200": 1979 / 4500}
LATENCY_FACTOR: dict[str, float] = {"gb300": 1.0, "gb200": 1.0, "b300": 1.0, "b200": 1.0, "h200": 1.3}
DP_EP_LATENCY_FACTOR = 1.2
P_OTHER_METHODS: dict[str, float] = {"eagle3": 0.70, "mtp": 0.80, "ngram": 0.50}
KV_BYTES_PER_TOKEN = MLA_LAYERS * MLA_BYTES_PER_TOKEN_LAYER
KDA_STATE_BYTES_PER_SEQ = KDA_LAYERS * KDA_HEADS * KDA_HEAD_DIM * KDA_HEAD_DIM * 4


# ------------------------------------------------------------------ shapes -------------------
@dataclass(frozen=True)
class EngineShape:
    """What the model needs to know about one engine group (pure data, built from a CR spec).

    ``tensor_parallel_size`` etc. are the group plan's values; ``decode_backend`` is ``stock``
    or ``latency_specialized`` (the megakernel path); ``spec_method`` one of
    ``none|dspark|eagle3|mtp|ngram`` with ``num_speculative_tokens`` drafts per step."""

    accelerator: str = "gb300"
    strategy: str = "tp"
    tensor_parallel_size: int = 8
    pipeline_parallel_size: int = 1
    data_parallel_size: int = 1
    expert_parallel: bool = False
    decode_backend: str = "stock"
    spec_method: str = "none"
    num_speculative_tokens: int = 0
    gpu_memory_utilization: float = 0.9
    variant: str = "mxfp4"
    kv_offload_gib: int = 0
    """Host KV tier of each engine, GiB over its ranks (``spec.engine.kvOffload``; 0: none)."""

    @property
    def speculative(self) -> bool:
        return self.spec_method != "none" and self.num_speculative_tokens > 0

    @property
    def k(self) -> int:
        """Drafts per step (0 without speculative decoding)."""
        return self.num_speculative_tokens if self.speculative else 0

    @property
    def gpus_per_engine(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def gpus(self) -> int:
        """GPUs of the whole group."""
        return self.gpus_per_engine * self.data_parallel_size

    @classmethod
    def from_spec(cls, spec: Any, plan: Any) -> EngineShape:
        """From a parsed ``KimiK3DeploymentSpec`` and its ``GroupPlan`` (``kimik3.admission.admit``)."""
        sd = spec.speculative_decoding
        return cls(
            accelerator=plan.profile.name,
            strategy=plan.strategy,
            tensor_parallel_size=plan.tensor_parallel_size,
            pipeline_parallel_size=plan.pipeline_parallel_size,
            data_parallel_size=plan.data_parallel_size,
            expert_parallel=plan.expert_parallel,
            decode_backend=spec.engine.decode_backend,
            spec_method=sd.method,
            num_speculative_tokens=(sd.num_speculative_tokens or 0) if sd.method != "none" else 0,
            gpu_memory_utilization=spec.engine.gpu_memory_utilization,
            variant=spec.model.variant,
            kv_offload_gib=kvcache.offload_gib(spec),
        )


@dataclass(frozen=True)
class PerfParams:
    """The model's coefficients for one lockstep unit of a group.

    A unit is what steps together: the single engine of a TP group, the whole group under expert
    parallelism (DP engines exchange tokens every layer, so they step in lockstep), or one DP
    engine of a TP-DP group without expert parallelism (independent engines)."""

    shape: EngineShape
    engines_per_unit: int
    """DP engines stepping together (their sequences share one step)."""
    units: int
    """Units per group."""
    gpus_per_unit: int
    floor_s: float
    """a: latency floor of one step, seconds (drafter and verification included when speculative)."""
    expert_stream_s: float
    """m: seconds to stream every routed expert once from HBM on this unit's GPUs."""
    per_token_s: float
    """b: seconds per verified token in the step (compute)."""
    prefill_tokens_per_s: float
    """Prefill throughput of the unit, tokens/s."""
    kv_capacity_tokens: int
    """KV-cache tokens the unit holds (for ``vllm:kv_cache_usage_perc``)."""
    kda_state_bytes_per_seq: float
    kv_free_bytes: float
    notes: tuple[str, ...] = field(default=())

    @property
    def tokens_verified_per_seq(self) -> int:
        """1 + k: tokens each running sequence puts through one step."""
        return 1 + self.shape.k


# ------------------------------------------------------------------ building blocks ----------
def expert_coverage(tokens: float) -> float:
    """Expected share (0..1) of the 896 routed experts touched by ``tokens`` tokens, each routed
    to 16 experts uniformly at random."""
    if tokens <= 0:
        return 0.0
    return 1.0 - float((1.0 - EXPERTS_PER_TOKEN / ROUTED_EXPERTS) ** tokens)


def _interp_gpus(values: dict[int, float], gpus: int) -> float:
    """Log-linear interpolation of a per-TP figure (8, 16) in GPU count, clamped outside."""
    lo, hi = 8, 16
    g = min(max(gpus, lo), hi)
    t = math.log(g / lo) / math.log(hi / lo)
    return values[lo] * float((values[hi] / values[lo]) ** t)


def _stream_s(accelerator: str, gpus: int) -> float:
    return ROUTED_EXPERT_BYTES / (gpus * HBM_BYTES_PER_S[accelerator] * BW_EFFICIENCY)


def _per_token_s(accelerator: str, gpus: int) -> float:
    return 1.0 / (DECODE_TOKENS_PER_GPU_S * COMPUTE_FACTOR[accelerator] * gpus)


def _floor_from_figure(step_s: float, accelerator: str, gpus: int, n1: int) -> float:
    """Solve a from a batch-1 step time with n1 verified tokens."""
    return step_s - _stream_s(accelerator, gpus) * expert_coverage(n1) - _per_token_s(accelerator, gpus) * n1


def _gb300_tp_floors(gpus: int) -> tuple[float, float]:
    """Latency floors (no speculation, DSpark with 7 drafts) of a stock GB300 TP engine of ``gpus`` GPUs."""
    floors_nospec = {tp: _floor_from_figure(1.0 / TOKS_STOCK_NOSPEC[tp], "gb300", tp, 1) for tp in (8, 16)}
    floors_dspark = {tp: _floor_from_figure(AL_BLOG / TOKS_STOCK_DSPARK[tp], "gb300", tp,
                                            1 + DSPARK_CALIBRATION_TOKENS) for tp in (8, 16)}
    return _interp_gpus(floors_nospec, gpus), _interp_gpus(floors_dspark, gpus)


def mk_floor_factor() -> float:
    """Ratio of the megakernel's latency floor to the stock one, solved on TP16 + DSpark (~0.50)."""
    n1 = 1 + DSPARK_CALIBRATION_TOKENS
    stock = _floor_from_figure(STEP_STOCK_TP16_DSPARK, "gb300", 16, n1)
    mk = _floor_from_figure(STEP_MK_TP16_DSPARK, "gb300", 16, n1)
    return mk / stock


MK_FLOOR_FACTOR = mk_floor_factor()


def acceptance_rate(method: str, num_speculative_tokens: int = DSPARK_CALIBRATION_TOKENS,
                    workload: str | float = DEFAULT_WORKLOAD) -> float:
    """Per-position chain acceptance probability p (draft i accepted with probability p^(i+1)).

    For dspark, p is solved so that AL at 7 drafts equals ``AL_DSPARK[workload]`` (or the float
    ``workload`` itself, taken as an acceptance length at 7 drafts). Other methods: an assumed p.
    """
    if method == "none":
        return 0.0
    if method != "dspark":
        return P_OTHER_METHODS[method]
    target = float(workload) if isinstance(workload, (int, float)) else AL_DSPARK[workload]
    k = DSPARK_CALIBRATION_TOKENS
    if target >= 1 + k:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if _al(mid, k) < target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def _al(p: float, k: int) -> float:
    return 1.0 + sum(p ** i for i in range(1, k + 1))


def acceptance_length(method: str, num_speculative_tokens: int, workload: str | float = DEFAULT_WORKLOAD) -> float:
    """Mean tokens per step (1 + accepted drafts): ``1 + p + ... + p^k`` (1.0 without speculation)."""
    if method == "none" or num_speculative_tokens <= 0:
        return 1.0
    return _al(acceptance_rate(method, num_speculative_tokens, workload), num_speculative_tokens)


def per_position_acceptance(method: str, num_speculative_tokens: int,
                            workload: str | float = DEFAULT_WORKLOAD) -> list[float]:
    """Probability that draft position i (0-based) is accepted: p^(i+1), i < k."""
    p = acceptance_rate(method, num_speculative_tokens, workload)
    return [p ** (i + 1) for i in range(num_speculative_tokens)]


def sample_accepted(p: float, k: int, rng: random.Random) -> int:
    """Accepted drafts of one step: consecutive successes of probability p, at most k."""
    accepted = 0
    while accepted < k and rng.random() < p:
        accepted += 1
    return accepted


# ------------------------------------------------------------------ the model ----------------
def perf_params(shape: EngineShape) -> PerfParams:
    """The coefficients of ``step_time`` for a group of this shape (see the module docstring)."""
    accel = shape.accelerator
    notes: list[str] = []
    ep = shape.expert_parallel or shape.strategy == "dep"
    dp = max(1, shape.data_parallel_size)
    if ep:
        engines_per_unit, units = dp, 1
        gpus = shape.gpus
    else:
        engines_per_unit, units = 1, dp
        gpus = shape.gpus_per_engine
    floor_nospec, floor_dspark7 = _gb300_tp_floors(gpus)
    if gpus not in (8, 16):
        notes.append(f"no published figure for {gpus} GPUs: floor interpolated from TP8/TP16")
    if shape.strategy != "tp" and ep:
        floor_nospec *= DP_EP_LATENCY_FACTOR
        floor_dspark7 *= DP_EP_LATENCY_FACTOR
        notes.append("data/expert parallel batch-1 floor: TP figure x DP_EP_LATENCY_FACTOR (assumption)")
    if shape.pipeline_parallel_size > 1:
        notes.append("pipeline parallelism not modelled beyond its GPU count")
    floor = floor_nospec
    if shape.speculative:
        floor += (floor_dspark7 - floor_nospec) * shape.k / DSPARK_CALIBRATION_TOKENS
    if shape.decode_backend == "latency_specialized":
        floor *= MK_FLOOR_FACTOR
        if not (gpus == 16 and shape.spec_method == "dspark"):
            notes.append("megakernel floor = stock floor x MK_FLOOR_FACTOR (solved on TP16 + DSpark; no published figure here)")
    floor *= LATENCY_FACTOR[accel]
    if accel != "gb300":
        notes.append(f"{accel}: scaled from GB300 figures (bandwidth, compute, latency factors)")

    # KV cache: free HBM per GPU after one share of the weights; MLA latent cache replicated per TP rank.
    free_per_gpu = kvcache.free_bytes_per_gpu(accel, shape.variant, shape.gpu_memory_utilization,
                                              gpus if ep else shape.gpus_per_engine)
    ranks_holding_cache = shape.data_parallel_size if ep else 1
    kv_free = free_per_gpu * ranks_holding_cache
    kda_per_seq = KDA_STATE_BYTES_PER_SEQ / max(1, shape.tensor_parallel_size)
    kv_tokens = int(kv_free / KV_BYTES_PER_TOKEN)
    return PerfParams(
        shape=shape,
        engines_per_unit=engines_per_unit,
        units=units,
        gpus_per_unit=gpus,
        floor_s=floor,
        expert_stream_s=_stream_s(accel, gpus),
        per_token_s=_per_token_s(accel, gpus),
        prefill_tokens_per_s=PREFILL_TOKENS_PER_GPU_S * COMPUTE_FACTOR[accel] * gpus,
        kv_capacity_tokens=kv_tokens,
        kda_state_bytes_per_seq=kda_per_seq,
        kv_free_bytes=kv_free,
        notes=tuple(notes),
    )


def kv_cache_blocks(params: PerfParams) -> KVBlocks:
    """The prefix cache of each engine of a group with these coefficients (``kvcache.kv_blocks``),
    its host tier included (``EngineShape.kv_offload_gib``)."""
    s = params.shape
    return kvcache.kv_blocks(s.accelerator, s.variant, s.gpu_memory_utilization, s.tensor_parallel_size,
                             s.pipeline_parallel_size, params.gpus_per_unit, s.k, s.kv_offload_gib)


def host_tier_load_s(params: PerfParams, blocks: int) -> float:
    """Seconds to load ``blocks`` blocks of the host tier back onto the engine's GPUs
    (``kvcache.host_load_s``): what a block found there costs instead of its prefill."""
    return host_load_s(params.shape.accelerator, kv_cache_blocks(params), blocks)


def step_time(params: PerfParams, decode_seqs: int, prefill_tokens: int = 0) -> float:
    """Seconds of one step of a unit with ``decode_seqs`` running decode sequences (summed over the
    unit's engines) and ``prefill_tokens`` prompt tokens scheduled into the same step.

    An idle unit (no sequences, no prefill) takes 0 s."""
    if decode_seqs <= 0 and prefill_tokens <= 0:
        return 0.0
    n = max(0, decode_seqs) * params.tokens_verified_per_seq
    t = params.floor_s + params.expert_stream_s * expert_coverage(n + prefill_tokens) + params.per_token_s * n
    return t + max(0, prefill_tokens) / params.prefill_tokens_per_s


def prefill_time(params: PerfParams, prompt_tokens: int) -> float:
    """Seconds to prefill ``prompt_tokens`` alone on the unit (TTFT at an idle engine = this + one step)."""
    return max(0, prompt_tokens) / params.prefill_tokens_per_s


def kv_cache_usage(params: PerfParams, context_tokens: int, seqs: int) -> float:
    """Share (0..1) of the KV cache held by ``seqs`` sequences with ``context_tokens`` tokens in total."""
    if params.kv_free_bytes <= 0:
        return 1.0
    used = context_tokens * KV_BYTES_PER_TOKEN + seqs * params.kda_state_bytes_per_seq
    return min(1.0, used / params.kv_free_bytes)


@dataclass(frozen=True)
class DecodePoint:
    """Steady decode at a fixed batch: what one user and the group see."""

    batch_per_engine: int
    step_s: float
    """Seconds per engine step (what ``vllm:inter_token_latency_seconds`` observes)."""
    tokens_per_step: float
    """1 + mean accepted drafts."""
    tpot_s: float
    """Seconds per output token for one user (step / tokens per step)."""
    tokens_per_s_per_user: float
    group_tokens_per_s: float
    """Output tokens/s of the whole group (all engines)."""


def decode_point(shape: EngineShape | PerfParams, batch_per_engine: int,
                 workload: str | float = DEFAULT_WORKLOAD) -> DecodePoint:
    """Steady-state decode with ``batch_per_engine`` running sequences on every DP engine."""
    params = shape if isinstance(shape, PerfParams) else perf_params(shape)
    s = params.shape
    al = acceptance_length(s.spec_method, s.k, workload)
    step = step_time(params, batch_per_engine * params.engines_per_unit)
    tpot = step / al
    per_user = 1.0 / tpot
    engines = params.engines_per_unit * params.units
    return DecodePoint(batch_per_engine, step, al, tpot, per_user, per_user * batch_per_engine * engines)


def ttft(shape: EngineShape | PerfParams, prompt_tokens: int, batch_per_engine: int = 0) -> float:
    """Seconds to first token of a request arriving at an engine running ``batch_per_engine``
    sequences, when its whole prompt fits one step (no queueing)."""
    params = shape if isinstance(shape, PerfParams) else perf_params(shape)
    return step_time(params, batch_per_engine * params.engines_per_unit, prompt_tokens)


def with_method(shape: EngineShape, method: str, k: int = 0, backend: str | None = None) -> EngineShape:
    """A copy of ``shape`` with another speculative method / decode backend (for comparisons)."""
    return replace(shape, spec_method=method, num_speculative_tokens=k if method != "none" else 0,
                   decode_backend=backend or shape.decode_backend)
