"""The policy's starting model of one group, from the recipe's profile (autoscaler/perfmodel.py).

The policy's model (``GroupLatencyModel``) maps ``c``, the mean number of requests running per
group, and ``n``, the number of groups, to the latency quantile the target is written in (P90 per
token by default) and to the mean per-token latency::

    quantile(c, n) = t0 + k (c + z sqrt(c / n))        mean(c, n) = t0 + k (c + w / n)

At a fixed batch ``b`` the perf model gives the per-token latency ``tpot(b)``; but a group serving
real traffic does not sit at its mean batch: requests arrive at random and finish at random, so
its batch moves around the mean, and the tokens emitted at the larger batches are the slow ones
that set the P90. The seed therefore takes the batch of ONE group with mean concurrency ``c`` as
Poisson (independent arrivals, each staying a random time: the M/G/infinity occupancy), weights
every batch ``b`` by the tokens it emits (``P(b) x b x tokens/s per request at b``), and reads the
quantile and the mean from that token distribution (the quantile interpolated linearly between
batch levels as Prometheus' ``histogram_quantile`` interpolates between bucket bounds).

The model is fitted to that curve (``n = 1``) between the concurrencies where the quantile is
``LOW x target`` and the target (the range the policy works in): ``w = 1`` (the token-weighted
mean of a Poisson batch is ``c + 1``), ``z`` and ``(t0, k)`` by least squares over the quantile
and the mean points; for the latency recipe at 5 ms the fit puts ``z`` at 2.0. With ``n`` groups
the router shares the fleet's Poisson total among them, and the same ``z`` and ``w`` apply to a
batch whose variance is ``c / n``: more groups, a smoother batch, more requests per group at the
same quantile.

Measured against the fleet simulator for the latency recipe (TP8 megakernel + DSpark, 5 ms):
windows of 2 to 14 groups fall on one line in the effective batch with ``z = 2, w = 1`` (no bias
by group count), ``t0`` 1.71 ms and ``k`` 0.75 ms per request; the seed's ``k`` is lower (0.55:
the perf model's batches, without the prefill steps that stretch some decode steps). The online
fit moves toward the fleet's line: each window gives two points at different effective batches
(quantile and mean), weighed against a prior of one pseudo-observation with a forgetting factor
of 0.98 per window (a memory of ~25 minutes at 30 s decisions), so the seed steers the first
minutes only. Until the slope has moved, the policy's scale-down is anchored on the quantile it
observes (policy/reaction.py).

Prefill (``prefill_terms``): ``theta``, the seconds of a group's time per prompt token it
computes, is ``1 /`` the perf model's prefill tokens/s of the group (its units'); ``d``, the decode
part of a step, the perf model's step at the batch where the curve meets the target; vLLM's
``max_num_batched_tokens`` (B) caps a step, so prefill takes at most ``B theta / (d + B theta)`` of
a group's time (``GroupLatencyModel.max_prefill_share``). The TTFT model (policy/ttft.py) takes
the same three numbers. The chunk steps (the model's mixture): a chunk's tokens at ``theta``
each, the step's fixed part for carrying one (``chunk_step_overhead``: ``step_time`` with a full
chunk less the decode step and the chunk's tokens, 18.9 ms on the latency recipe at its target's
batch), the mean chunk at ``B`` until the model has seen prompts, the tokens per request per step
at the perf model's acceptance length (1 for a per-step target), the share they may hold before
they set the quantile at ``1 -`` the target's percentile.
"""

from __future__ import annotations

import math

from kimik3.admission import Admitted
from kimik3.api.v1alpha1 import KimiK3DeploymentSpec
from kimik3.autoscaler.policy import GroupLatencyModel
from kimik3.autoscaler.policy.ttft import TTFTModel
from kimik3.autoscaler.perfmodel import EngineShape, PerfParams, decode_point, perf_params, step_time
from kimik3.topology.plan import GroupPlan

LOW = 0.6
"""Lower end of the fitted range, as a share of the target (the upper end is the target)."""
W = 1.0
"""Token-weighted mean batch of a Poisson batch of mean c: c + 1 (shared by n groups: c + 1 / n)."""
MAX_BATCH = 256
FORGET = 0.98
"""Forgetting factor of the online fit per window (memory ~50 windows: ~25 min at 30 s)."""
PRIOR_WEIGHT = 1.0
"""Pseudo-observations of the seed line in the online fit (each window brings two points)."""


def latency_quantile_curve(spec: KimiK3DeploymentSpec, plan: GroupPlan, q: float, per_step: bool = False,
                           means: list[float] | None = None) -> list[tuple[float, float, float]]:
    """``(mean concurrency per group, latency quantile, mean latency)`` (seconds per token, or per
    engine step when ``per_step``) for Poisson batches of each mean in ``means``."""
    params = perf_params(EngineShape.from_spec(spec, plan))
    engines = params.engines_per_unit * params.units
    n_max = min(MAX_BATCH, spec.engine.max_num_seqs * engines)
    points = [decode_point(params, max(1, math.ceil(n / engines))) for n in range(1, n_max + 1)]
    level = [(p.step_s if per_step else p.tpot_s) for p in points]
    speed = [p.tokens_per_s_per_user for p in points]
    out = []
    for mean in means or [0.25 * i for i in range(1, 4 * 40)]:
        weights = []
        p = math.exp(-mean)
        for n in range(1, n_max + 1):
            p *= mean / n
            weights.append(p * n * speed[n - 1])
        total = sum(weights)
        if total <= 0:
            continue
        mean_latency = sum(w * lv for w, lv in zip(weights, level)) / total
        rank, acc, prev_level, value = q * total, 0.0, 0.0, level[-1]
        for w, lv in zip(weights, level):
            if acc + w >= rank:
                value = prev_level + (lv - prev_level) * (rank - acc) / w if w > 0 else lv
                break
            acc += w
            prev_level = lv
        out.append((mean, value, mean_latency))
    return out


def seed_model(admitted: Admitted) -> GroupLatencyModel:
    """The starting model for the admitted spec's group and its ``autoscaling.target``."""
    target = admitted.seconds.latency_target
    per_step = admitted.spec.autoscaling.target.metric == "interTokenLatency"
    curve = latency_quantile_curve(admitted.spec, admitted.plan, admitted.target_quantile, per_step)
    points = [(c, y, m) for c, y, m in curve if LOW * target <= y <= target]
    if len(points) < 2 or curve[0][1] >= target:
        # Target at or below the batch-1 latency: no load meets it; a steep line says so.
        first = curve[0]
        return GroupLatencyModel(t0=first[1], k=first[1], seed_c=1.0, seed_c_low=0.5)
    best = None
    for i in range(0, 41):
        z = i / 10
        xs = [c + z * math.sqrt(c) for c, _, _ in points] + [c + W for c, _, _ in points]
        ys = [y for _, y, _ in points] + [m for _, _, m in points]
        t0, k, err = _line(xs, ys)
        if k > 0 and (best is None or err < best[0]):
            best = (err, z, t0, k)
    if best is None:  # no rising line through the points: treat as the steep case
        first = curve[0]
        return GroupLatencyModel(t0=first[1], k=first[1], seed_c=1.0, seed_c_low=0.5)
    _, z, t0, k = best
    c_lo, c_hi = points[0][0], points[-1][0]
    theta, _, budget, share = prefill_terms(admitted)
    params, _ = _target_step(admitted)
    al = 1.0 if per_step else decode_point(params, 1).tokens_per_step
    return GroupLatencyModel(t0=t0, k=k, z=z, w=W, forget=FORGET, prior_weight=PRIOR_WEIGHT,
                             seed_c_low=c_lo + z * math.sqrt(c_lo), seed_c=c_hi + z * math.sqrt(c_hi),
                             theta=theta, max_prefill_share=share, q=admitted.target_quantile, budget=budget,
                             al=al, chunk_theta=theta, chunk_step_s=chunk_step_overhead(admitted),
                             chunk_tokens=float(budget))


def prefill_terms(admitted: Admitted) -> tuple[float, float, int, float]:
    """``(theta, d, B, max share)`` of the admitted spec's group (module docstring): seconds of
    the group's time per prompt token computed, seconds of a step's decode part at the target,
    ``max_num_batched_tokens``, and the share of its time prefill may take at most."""
    params, seqs = _target_step(admitted)
    theta = 1.0 / (params.prefill_tokens_per_s * params.units)
    step = step_time(params, seqs)
    budget = admitted.spec.engine.max_num_batched_tokens
    unit_theta = 1.0 / params.prefill_tokens_per_s
    return theta, step, budget, budget * unit_theta / (step + budget * unit_theta)


def chunk_step_overhead(admitted: Admitted) -> float:
    """Seconds a step that carries a full chunk (``max_num_batched_tokens``) takes beyond its
    decode part at the target's batch and the chunk's own ``B / prefill_rate``: the perf model's
    ``step_time`` with the chunk less those two (the experts' weights the prompt tokens stream)."""
    params, seqs = _target_step(admitted)
    budget = admitted.spec.engine.max_num_batched_tokens
    return step_time(params, seqs, budget) - step_time(params, seqs) - budget / params.prefill_tokens_per_s


def _target_step(admitted: Admitted) -> tuple[PerfParams, int]:
    """The perf model of the admitted spec's group and the decode sequences of one unit's step
    at the batch where the latency curve meets the target."""
    spec, plan = admitted.spec, admitted.plan
    params = perf_params(EngineShape.from_spec(spec, plan))
    per_step = spec.autoscaling.target.metric == "interTokenLatency"
    curve = latency_quantile_curve(spec, plan, admitted.target_quantile, per_step)
    c = max([c for c, y, _ in curve if y <= admitted.seconds.latency_target] or [curve[0][0]])
    return params, max(1, math.ceil(c / (params.engines_per_unit * params.units))) * params.engines_per_unit


def seed_ttft(admitted: Admitted) -> TTFTModel:
    """The starting TTFT model of the admitted spec's group (policy/ttft.py; its ``base`` is
    learned from the first window)."""
    theta, step, budget, _ = prefill_terms(admitted)
    return TTFTModel(theta=theta, step_s=step, budget=budget)


def _line(xs: list[float], ys: list[float]) -> tuple[float, float, float]:
    """Least-squares ``y = t0 + k x``: (t0, k, sum of squared residuals)."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    k = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx > 0 else 0.0
    t0 = my - k * mx
    return t0, k, sum((y - t0 - k * x) ** 2 for x, y in zip(xs, ys))
