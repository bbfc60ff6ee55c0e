"""The arithmetic of the routing benchmark (``bench/routing.py``): a Mooncake trace replayed through
a deployment's Service and through the inference gateway's endpoint picker.

- ``cache_ceiling``: the prefix-cache hit rate (share of prompt tokens) one cache shared by every
  engine would reach on a trace, caching in blocks of ``block_tokens`` (1024 on a GB300 TP8 group,
  ``perfmodel.kv_cache_blocks``) and never matching a prompt's last token, as the simulated engine
  counts ``vllm:prefix_cache_hits`` / ``vllm:prefix_cache_queries``: unbounded, what the engines'
  counters can reach at most (the trace's own ``tracefile.reuse_ceiling`` counts its 512-token
  blocks instead: the issue's ceiling); of the pool's blocks (groups x blocks per group, and the
  groups' host tiers behind them when ``spec.engine.kvOffload`` gives them one), what any router
  can reach at most with the engines' memory, had it one cache of all of it.
- ``prefix_cache_tokens``: (queries, GPU hits, host-tier hits) of one engine server's ``/metrics``
  text, summed over its engines: a prompt token is found either in the GPU cache
  (``vllm:prefix_cache_hits``) or, with a host tier, loaded from it (``vllm:external_prefix_cache_hits``,
  vLLM 0.33's KV-connector counter).
- ``goodput``: requests per second that met the SLO, each request on its own (DistServe's goodput).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from prometheus_client.parser import text_string_to_metric_families

from kimik3_dev.sim.load import RequestResult
from kimik3_dev.sim.prefixcache import HostTier, PrefixCache
from kimik3_dev.sim.tracefile import MOONCAKE_BLOCK_TOKENS, Request

PREFIX_QUERIES = "vllm:prefix_cache_queries"
PREFIX_HITS = "vllm:prefix_cache_hits"
EXTERNAL_HITS = "vllm:external_prefix_cache_hits"


def cache_ceiling(requests: Iterable[Request], block_tokens: int, blocks: int | None = None,
                  host_blocks: int = 0) -> float | None:
    """Share (0..1) of the prompt tokens of ``requests`` (in arrival order) found by one prefix cache
    that every request reaches, of ``blocks`` blocks (None: unbounded) of ``block_tokens`` tokens
    and a host tier of ``host_blocks`` behind it (written through, looked up after the GPU blocks,
    its hits loaded back: the simulated engine's ``prefixcache.HostTier``),
    counted as the engines count ``vllm:prefix_cache_hits``: the engine's own ``PrefixCache`` (LRU,
    a match stops short of the last token), each request looked up, then its full blocks cached
    and freed before the next (no request holds blocks while others arrive). An engine block is
    ``block_tokens / MOONCAKE_BLOCK_TOKENS`` trace blocks, named by the last one's hash id (a
    Mooncake id stands for its whole prefix); a request's full blocks are those its hash ids and its
    prompt length both cover. None when no request carries hash ids. Raises ValueError for a block
    size that is not a multiple of ``MOONCAKE_BLOCK_TOKENS``."""
    if block_tokens < MOONCAKE_BLOCK_TOKENS or block_tokens % MOONCAKE_BLOCK_TOKENS:
        raise ValueError(f"block_tokens must be a multiple of {MOONCAKE_BLOCK_TOKENS} (got {block_tokens})")
    per = block_tokens // MOONCAKE_BLOCK_TOKENS
    ordered = sorted(requests, key=lambda r: r.arrival_s)
    if not any(r.hash_ids for r in ordered):
        return None
    cache = PrefixCache(sum(len(r.hash_ids) for r in ordered) if blocks is None else blocks, block_tokens)
    host = HostTier(host_blocks)
    queried = hit = 0
    for r in ordered:
        full = min(len(r.hash_ids) // per, r.prompt_tokens // block_tokens)
        names = [str(r.hash_ids[(b + 1) * per - 1]).encode() for b in range(full)]
        queried += r.prompt_tokens
        local = cache.match(names, r.prompt_tokens)
        found = local + host.match(names, local, max(0, r.prompt_tokens - 1) // block_tokens)
        hit += found * block_tokens
        host.store(names[found:])
        cache.release(names[:cache.acquire(names)])
    return hit / queried if queried else None


def prefix_cache_tokens(metrics_text: str) -> tuple[float, float, float]:
    """(prompt tokens looked up, tokens found on the GPUs, tokens loaded from the host tier) in an
    engine server's Prometheus text: the sums of ``vllm:prefix_cache_queries_total``,
    ``vllm:prefix_cache_hits_total`` and ``vllm:external_prefix_cache_hits_total`` over its series."""
    sums = {PREFIX_QUERIES: 0.0, PREFIX_HITS: 0.0, EXTERNAL_HITS: 0.0}
    for family in text_string_to_metric_families(metrics_text):
        if family.name in sums:
            sums[family.name] += sum(s.value for s in family.samples if s.name.endswith("_total"))
    return sums[PREFIX_QUERIES], sums[PREFIX_HITS], sums[EXTERNAL_HITS]


def meets_slo(result: RequestResult, ttft_target_s: float, itl_target_s: float, percentile: float = 90) -> bool:
    """Whether one request met the SLO: answered, TTFT <= ``ttft_target_s`` and the ``percentile``
    of its per-token latencies <= ``itl_target_s`` (nearest rank, as ``load.summarize``: at most
    ``n - ceil(percentile/100 x n)`` of its n latencies over the target; a request of one token has
    none: TTFT alone)."""
    if not result.ok or result.ttft is None or result.ttft > ttft_target_s:
        return False
    n = len(result.itl_per_token)
    over = sum(x > itl_target_s for x in result.itl_per_token)
    return over <= n - math.ceil(percentile / 100 * n)


def goodput(results: Sequence[RequestResult], span_s: float, ttft_target_s: float, itl_target_s: float) -> float:
    """Requests per second that met the SLO (``meets_slo``) over ``span_s`` seconds (the replay's
    arrival span). Raises ValueError for a span <= 0."""
    if span_s <= 0:
        raise ValueError(f"span_s must be > 0 (got {span_s})")
    return sum(meets_slo(r, ttft_target_s, itl_target_s) for r in results) / span_s
