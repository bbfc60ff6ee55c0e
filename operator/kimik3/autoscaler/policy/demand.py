"""The demand now, from one observation: what the policy sizes for and what the model learns from.

- Demand (output tokens/s; request-steps/s for a per-step target): the window's throughput
  scaled up by the queue (``(running + waiting) / running``).
- Prefill (prompt tokens/s the groups compute: ``vllm:prompt_tokens`` less the prefix cache's
  ``vllm:prefix_cache_hits``), scaled by the same factor (the waiting requests' prompts are not
  computed yet) and by the panic path's (the mix of prompt and output tokens taken as the
  window's).
- Panic path: when the fleet is saturated (quantile > ``SATURATED`` x T) at least the requests
  running and waiting now at the latency they see now (Little's law: the window lags a jump;
  this sizes the jump in one decision, several groups at once, bounded by max): the window's
  quantile, or the model's mean latency at the batch they make now where that is slower (a
  window that began before the jump holds the faster steps of before, and read alone it
  over-asks).
- Concurrency per serving group by Little's law: tokens/s x mean per-token latency from the ITL
  histogram's sum / count; the running gauge without a sum.
"""

from __future__ import annotations

from dataclasses import dataclass

from kimik3.autoscaler.observation import DecodeObservation
from kimik3.autoscaler.policy.model import LEARN_RANGE, GroupLatencyModel

SATURATED = LEARN_RANGE[1]
"""Over this multiple of the target the window's throughput lags the demand (a level shift)."""


@dataclass(frozen=True)
class Reading:
    """What one window with traffic says, in the model's units (seconds per token, or per engine
    step for a per-step target)."""

    demand: float
    """Output tokens/s (request-steps/s per step), the queue's share and the panic path included."""
    per_group_c: float
    """Mean requests running per serving group over the window (Little's law)."""
    mean_latency: float | None
    """Mean latency from the ITL histogram's sum / count; None without a sum."""
    prefill: float = 0.0
    """Prompt tokens/s to compute (the prefix cache's hits excluded), the fleet's, scaled as ``demand``."""
    prefill_now: float = 0.0
    """Prompt tokens/s the groups computed over the window (what the model learns from)."""


def read(obs: DecodeObservation, latency: float | None, model: GroupLatencyModel, serving: int,
         target_s: float, per_step: bool) -> Reading:
    """``obs`` read over ``serving`` groups; ``latency`` is its quantile at the target's percentile
    (None without samples), ``target_s`` the target; ``per_step``: the target is per engine step
    (raw ITL), not per output token."""
    al = obs.acceptance_length
    tokens_per_s = obs.generation_tokens / obs.window_s if obs.window_s > 0 else 0.0
    # The model's unit: seconds per token (or per engine step for a per-step target); its
    # demand: tokens/s (or request-steps/s), so that Little's law reads c x n = demand x mean.
    rate = tokens_per_s / al if per_step else tokens_per_s
    mean_step = obs.itl.sum / obs.itl.count if obs.itl.count > 0 and obs.itl.sum > 0 else None
    mean_latency = None if mean_step is None else (mean_step if per_step else mean_step / al)
    if mean_step is not None and tokens_per_s > 0:
        # Little's law over the window: mean requests running = tokens/s x mean seconds per token.
        per_group_c = tokens_per_s * (mean_step / al) / serving
    else:
        per_group_c = obs.running / serving
    queue_factor = (obs.running + obs.waiting) / obs.running if obs.running > 0 else 1.0
    window_demand = rate * queue_factor
    prefill_now = obs.prefill_tokens_per_s
    demand = panic(window_demand, obs, latency, model, serving, target_s, prefill_now)
    prefill = prefill_now * queue_factor * (demand / window_demand if window_demand > 0 else 1.0)
    return Reading(demand, per_group_c, mean_latency, prefill, prefill_now)


def panic(demand: float, obs: DecodeObservation, latency: float | None, model: GroupLatencyModel,
          serving: int, target_s: float, prefill: float = 0.0) -> float:
    """``demand`` (the window's), or on a saturated fleet (``latency`` over ``SATURATED`` x
    ``target_s``) the requests running and waiting now over the latency they see now, if more
    (the model's at ``prefill`` prompt tokens/s over the ``serving`` groups)."""
    if latency is not None and latency > SATURATED * target_s:
        # Far over target (saturated: a level shift the window lags): the requests running
        # now, each at the window's latency quantile or at the model's mean latency for the
        # batch they make now, whichever is slower (a window that began before the jump holds
        # faster steps than the ones taken now), are the current demand (Little's law). Panic
        # path: this sizes the jump at once, several groups in one decision.
        now_latency = max(latency, model.mean_latency(obs.running / serving, serving, prefill / serving))
        demand = max(demand, (obs.running + obs.waiting) / now_latency)
    return demand
