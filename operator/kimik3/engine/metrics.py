"""Names of vLLM 0.33's metrics that more than one part of the operator reads: the autoscaler
(``autoscaler.observation``) and the endpoint picker's flags (``render.routing``)."""

from __future__ import annotations

WAITING = "vllm:num_requests_waiting"
"""Requests queued in the engine (gauge)."""
KV_USAGE = "vllm:kv_cache_usage_perc"
"""Share of the KV cache in use, 0..1 (gauge; vLLM before 0.10 named it ``vllm:gpu_cache_usage_perc``)."""
