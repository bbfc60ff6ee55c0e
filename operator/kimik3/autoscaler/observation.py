"""What the autoscaler knows about one deployment over one window, from either metric source.

vLLM's ITL histogram times engine *steps*: each observation is the time between two successive
outputs of a running request, and under speculative decoding a step emits 1 + accepted tokens
(~4-5 with DSpark). The per-token latency a user feels (TPOT, the inverse of tokens/s per user)
is therefore the step time divided by the tokens per step, 1 + accepted / drafts over the same
window (kimi-k3-and-vllm.md, "what ITL really measures"). ``token_latency_quantile`` applies
that conversion; ``step_latency_quantile`` is vLLM's raw ITL; ``latency_quantile`` is the one
``spec.autoscaling.target.metric`` names.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kimik3.api.conditions import Reason
from kimik3.api.v1alpha1 import LatencyMetric
from kimik3.autoscaler.histogram import Histogram, above_top, quantile

ITL = "vllm:inter_token_latency_seconds"
ITL_OLD = "vllm:time_per_output_token_seconds"
"""Deprecated in vLLM 0.11 and removed in 2026; read only when ITL is absent (failure case F8)."""
TTFT = "vllm:time_to_first_token_seconds"
RUNNING = "vllm:num_requests_running"
DRAFTS = "vllm:spec_decode_num_drafts"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens"
GENERATION_TOKENS = "vllm:generation_tokens"
PROMPT_TOKENS = "vllm:prompt_tokens"
"""Prompt tokens of the requests prefilled, those served from the prefix cache included."""
PREFIX_CACHE_HITS = "vllm:prefix_cache_hits"
"""Prompt tokens found in the prefix cache (not computed again)."""
REQUEST_SUCCESS = "vllm:request_success"
"""Finished requests, by label ``finished_reason`` (stop, length, abort, error, repetition)."""
FINISHED_REASONS = ("stop", "length", "abort", "error", "repetition")
"""Values of ``vllm:request_success``'s ``finished_reason`` label (vLLM's FinishReason)."""
FAILED_REASON = "error"
"""The ``finished_reason`` of a request the engine failed (``abort`` is the client's doing)."""


class MetricsUnavailable(Exception):
    """No usable reading: the autoscaler holds replicas and sets MetricsAvailable=False with
    this reason (one of ``kimik3.api.conditions.METRICS_UNAVAILABLE``) and message."""

    def __init__(self, reason: Reason, message: str):
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass(frozen=True)
class DecodeObservation:
    """One deployment over ``window_s`` seconds ending at ``at`` (unix seconds).

    Histograms hold the observations made inside the window, summed over every engine of every
    group that reported. Gauges are the latest values summed over engines (KV usage: the
    highest engine). Counters are increases over the window.
    """

    at: float
    window_s: float
    itl: Histogram
    """Engine-step latency observations (seconds), from ``itl_metric``."""
    itl_metric: str
    ttft: Histogram = field(default_factory=Histogram)
    running: float = 0.0
    """Requests in the running batch, summed over engines and groups."""
    waiting: float = 0.0
    """Requests queued, summed over engines and groups."""
    kv_usage: float | None = None
    """Highest KV-cache usage of any engine, 0..1."""
    drafts: float = 0.0
    accepted: float = 0.0
    generation_tokens: float = 0.0
    """Output tokens produced in the window."""
    prompt_tokens: float = 0.0
    """Prompt tokens of the requests prefilled in the window (``vllm:prompt_tokens``)."""
    prefix_cache_hits: float = 0.0
    """Of those, tokens served from the prefix cache (``vllm:prefix_cache_hits``): not computed."""
    requests_finished: float = 0.0
    """Requests that finished in the window, for any reason."""
    requests_failed: float = 0.0
    """Of those, requests the engine failed (``finished_reason="error"``)."""
    groups: frozenset[str] = frozenset()
    """Group indexes that reported (a group scraped for the first time included: its gauges count)."""
    covered: frozenset[str] = frozenset()
    """Of ``groups``, those whose counters cover the whole window: samples at (or before) its
    start and at its end, no counter reset between. Counters of the others (a group scraped the
    first time, back after a gap, joined without a known zero, its engine restarted) hold only
    part of the window, so their demand reads low. A reading is whole only when every serving
    group is covered (policy/latency.py: a decision on a partial reading never scales down)."""

    @property
    def acceptance_length(self) -> float:
        """Tokens per engine step: 1 + accepted / drafts (1.0 without speculative decoding)."""
        return 1.0 + self.accepted / self.drafts if self.drafts > 0 else 1.0

    @property
    def prefill_tokens_per_s(self) -> float:
        """Prompt tokens/s the groups computed over the window: prompt tokens less the prefix
        cache's hits (those cost no prefill step), summed over the groups."""
        if self.window_s <= 0:
            return 0.0
        return max(0.0, self.prompt_tokens - self.prefix_cache_hits) / self.window_s

    def ttft_quantile(self, q: float) -> float | None:
        """Quantile ``q`` (0..1) of the time to first token over the window, seconds (None
        without observations)."""
        return quantile(q, self.ttft)

    @property
    def has_traffic(self) -> bool:
        """Any request ran or waited in the window ("no traffic" is a valid reading)."""
        return self.itl.count > 0 or self.running > 0 or self.waiting > 0 or self.generation_tokens > 0

    @property
    def error_rate(self) -> float | None:
        """Share of the window's finished requests that failed; None when none finished."""
        return self.requests_failed / self.requests_finished if self.requests_finished > 0 else None

    def step_latency_quantile(self, q: float) -> float | None:
        """Quantile of vLLM's raw ITL (seconds per engine step), None without observations."""
        return quantile(q, self.itl)

    def token_latency_quantile(self, q: float) -> float | None:
        """Quantile of the per-output-token latency (seconds per token): step quantile divided by
        the window's mean tokens per step."""
        step = self.step_latency_quantile(q)
        return None if step is None else step / self.acceptance_length

    def latency_quantile(self, metric: LatencyMetric, q: float) -> float | None:
        """Quantile ``q`` (0..1) of ``metric``, seconds: ``token_latency_quantile`` for
        timePerOutputToken, ``step_latency_quantile`` for interTokenLatency."""
        return self.step_latency_quantile(q) if metric == "interTokenLatency" else self.token_latency_quantile(q)

    def above_top_bucket(self, q: float) -> bool:
        """``latency_quantile(..., q)`` (either metric) is only a lower bound: the quantile's rank
        lands in the ``+Inf`` bucket of the ITL histogram (failure case F21a)."""
        return above_top(q, self.itl)

    def tokens_per_second_per_user(self, q: float = 0.9) -> float | None:
        """1 / the per-output-token latency at quantile ``q``; None without observations."""
        t = self.token_latency_quantile(q)
        return 1.0 / t if t else None
