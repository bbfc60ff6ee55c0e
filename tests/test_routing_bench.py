"""The routing benchmark's arithmetic (``kimik3_dev.benchmark.routing``, run by bench/routing.py):
the engines' ceiling on a trace, their prefix-cache counters, and requests per second at the SLO."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest

from kimik3_dev.benchmark.routing import cache_ceiling, goodput, meets_slo, prefix_cache_tokens
from kimik3_dev.sim.load import RequestResult
from kimik3_dev.sim.vllm_metrics import EngineMetrics
from kimik3_dev.sim.tracefile import Request


def test_the_cache_ceiling_counts_full_engine_blocks_seen_before_and_never_the_last_token():
    trace = [
        Request(2.0, 2049, 1, (0, 1, 2, 3, 9)),   # last: blocks 1 and 3 both cached (2048 < 2049 tokens)
        Request(0.0, 2048, 1, (0, 1, 2, 3)),      # first: nothing cached; caches blocks named 1 and 3
        Request(1.0, 3000, 1, (0, 1, 2, 3, 4, 5)),  # both found; a third 1024-token block is not full
        Request(3.0, 2048, 1, (0, 1, 7, 8)),      # block 1 found, block 8 (another prefix) not: 1024
    ]
    assert cache_ceiling(trace, 1024) == pytest.approx((0 + 2048 + 2048 + 1024) / (2048 + 3000 + 2049 + 2048))
    # At the trace's own 512-token blocks the last-token rule caps the second request's 2048 at 1536.
    assert cache_ceiling(trace[1:2] * 1 + [Request(1.0, 2048, 1, (0, 1, 2, 3))], 512) == \
        pytest.approx(1536 / 4096)
    assert cache_ceiling([Request(0.0, 4096, 1)], 1024) is None
    # Of 2 blocks (LRU): the fourth request's block 8 evicts block 3 (freed least recently), which the fifth misses.
    small = [*trace, Request(4.0, 3000, 1, (0, 1, 2, 3, 4, 5))]
    assert cache_ceiling(small, 1024, 2) == pytest.approx((0 + 2048 + 2048 + 1024 + 1024) / (2048 + 3000 + 2049 + 2048 + 3000))
    assert cache_ceiling(small, 1024) == pytest.approx((0 + 2048 + 2048 + 1024 + 2048) / (2048 + 3000 + 2049 + 2048 + 3000))
    # A host tier of 2 blocks behind the GPUs' 2, written through: it still holds block 3 (it evicted
    # block 1, which the GPUs keep), so the fifth request loads it back: the unbounded figure.
    assert cache_ceiling(small, 1024, 2, host_blocks=2) == pytest.approx(cache_ceiling(small, 1024))
    # Of 1 block it holds only the last block stored (8): no help.
    assert cache_ceiling(small, 1024, 2, host_blocks=1) == pytest.approx(cache_ceiling(small, 1024, 2))
    with pytest.raises(ValueError, match="multiple of 512"):
        cache_ceiling(trace, 768)


def test_prefix_cache_tokens_sum_the_counters_over_the_engines():
    metrics = EngineMetrics("kimi-k3", engines=(0, 1), kv_offload=True)
    metrics["prefix_cache_queries"][0].inc(30720)
    metrics["prefix_cache_queries"][1].inc(1000)
    metrics["prefix_cache_hits"][0].inc(20480)
    metrics["external_prefix_cache_queries"][0].inc(10240)
    metrics["external_prefix_cache_hits"][0].inc(4096)
    metrics["num_requests_running"][0].set(3)
    text = metrics.render()[0].decode()
    assert prefix_cache_tokens(text) == (31720.0, 20480.0, 4096.0)
    # The same registry with its ``_created`` series (prometheus-client's plain exposition): not counted.
    with_created = generate_latest(metrics.registry).decode()
    assert "vllm:prefix_cache_hits_created" in with_created
    assert prefix_cache_tokens(with_created) == (31720.0, 20480.0, 4096.0)
    assert prefix_cache_tokens("") == (0.0, 0.0, 0.0)


def _result(ttft: float | None, itl: list[float], ok: bool = True) -> RequestResult:
    return RequestResult("trace", ok, 0.0, ttft=ttft, itl_per_token=itl)


def test_a_request_meets_the_slo_by_its_ttft_and_the_p90_of_its_own_per_token_latencies():
    nine_fast = [0.004] * 9
    assert meets_slo(_result(1.5, nine_fast + [0.050]), 2.0, 0.005)  # 1 of 10 over: P90 (9th) is 4 ms
    assert not meets_slo(_result(1.5, [0.004] * 8 + [0.050] * 2), 2.0, 0.005)  # 2 of 10 over
    assert not meets_slo(_result(2.5, nine_fast), 2.0, 0.005)  # TTFT over
    assert meets_slo(_result(0.3, []), 2.0, 0.005)  # one token: TTFT alone
    assert not meets_slo(_result(0.3, [], ok=False), 2.0, 0.005)
    assert not meets_slo(_result(None, []), 2.0, 0.005)
    assert not meets_slo(_result(1.0, [0.006]), 2.0, 0.005)  # one latency: it is the P90


def test_goodput_is_the_requests_that_met_the_slo_per_second_of_the_arrival_span():
    results = [_result(1.0, [0.004]), _result(0.5, []), _result(3.0, [0.001]), _result(1.0, [0.009])]
    assert goodput(results, 4.0, 2.0, 0.005) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="span_s must be > 0"):
        goodput(results, 0.0, 2.0, 0.005)
