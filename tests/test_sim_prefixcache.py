"""The engine simulator's prefix cache: vLLM's chained block hashes, LRU eviction, capacity, and
the perf model's blocks per engine."""

from __future__ import annotations

import pytest

from kimik3.autoscaler import perfmodel as pm
from kimik3_dev.sim.engine import WORDS, token_ids
from kimik3_dev.sim.prefixcache import HostTier, PrefixCache, block_hashes


def test_block_hashes_chain_full_blocks_only():
    a = block_hashes(list(range(10)), 4)
    assert len(a) == 2 and all(len(h) == 32 for h in a)  # 10 tokens: 2 full blocks, the partial one not hashed
    assert block_hashes(list(range(8)) + [99, 98], 4) == a  # only the full blocks count
    b = block_hashes([0, 1, 2, 3, 9, 9, 9, 9], 4)
    assert b[0] == a[0] and b[1] != a[1]
    # the same block of ids after another prefix is another block (the hash chains the parent)
    assert block_hashes([7, 7, 7, 7, 4, 5, 6, 7], 4)[1] != a[1]
    # words outside the simulated vocabulary get hashed ids above it (up to 2**32 + 32), hashed as well
    assert len(block_hashes(token_ids("alpha beta gamma delta"), 2)) == 2
    assert max(token_ids("alpha beta gamma delta")) >= len(WORDS) + 1


def test_lru_eviction_order_and_capacity():
    cache = PrefixCache(capacity=3, block_size=4)
    a1, a2, b1, c1, d1, e1 = (bytes([i]) * 32 for i in range(6))
    assert cache.acquire([a1, a2]) == 2
    cache.release([a1, a2])  # freed last block first: a2 is evicted before a1
    assert cache.acquire([b1]) == 1
    cache.release([b1])
    assert len(cache) == 3 and cache.match([a1, a2], 100) == 2
    assert cache.acquire([c1]) == 1  # full: evicts a2, the least recently freed
    assert a2 not in cache and a1 in cache and b1 in cache and len(cache) == 3
    assert cache.match([a1, a2], 100) == 1  # the prefix's head survives its tail
    assert cache.acquire([a1]) == 1  # a hit pins a1: no longer evictable
    assert cache.acquire([d1]) == 1  # evicts b1 (next free), not a1 nor c1 (pinned)
    assert b1 not in cache and {a1, c1, d1} == {h for h in (a1, b1, c1, d1) if h in cache}
    assert cache.acquire([e1]) == 0 and e1 not in cache  # every block pinned: nothing stored, nothing evicted
    cache.release([a1])
    assert cache.acquire([e1]) == 1 and a1 not in cache and len(cache) == 3


def test_a_lookup_never_matches_the_prompts_last_token():
    cache = PrefixCache(capacity=10, block_size=4)
    ids = list(range(8))
    cache.acquire(block_hashes(ids, 4))
    assert cache.match(block_hashes(ids, 4), prompt_tokens=8) == 1  # 8 tokens, 2 blocks: the last is recomputed
    assert cache.match(block_hashes(ids + [5], 4), prompt_tokens=9) == 2
    with pytest.raises(ValueError, match="block_size >= 1 token"):
        PrefixCache(capacity=1, block_size=0)


@pytest.mark.parametrize("tp,k,block_size,blocks", [(8, 0, 1024, 896), (8, 7, 1024, 896), (16, 0, 512, 5622),
                                                     (16, 7, 512, 5622)])
def test_blocks_per_engine_from_the_perf_model(tp, k, block_size, blocks):
    """GB300 (288 GB), mxfp4 (1680 GB of weights), gpu_memory_utilization 0.9: TP8 leaves
    259.2 - 210 = 49.2 GB per GPU; a KDA layer's state per GPU (64/8 heads x 128 x 128 x 4 B +
    conv 3 x 8 x 128 x 3 x 2 B = 542,720 B; with 7 drafts the conv state keeps 3 + 7 columns:
    585,728 B) needs 128 x ceil(state / (128 x 576)) = 1024 tokens of MLA page; a block is 93
    pages of 1024 x 576 B = 54,853,632 B -> 896 blocks."""
    shape = pm.EngineShape(tensor_parallel_size=tp, spec_method="dspark" if k else "none", num_speculative_tokens=k)
    kv = pm.kv_cache_blocks(pm.perf_params(shape))
    assert (kv.block_size, kv.blocks) == (block_size, blocks)
    assert kv.block_bytes == 93 * block_size * 576 and kv.tokens == blocks * block_size


def test_host_tier_is_written_through_lru_and_matched_after_the_gpu_hits():
    host = HostTier(capacity=3)
    a, b, c, d = (bytes([i]) * 32 for i in range(4))
    assert host.store([a, b]) == 2 and host.store([b, c]) == 1  # b held: only marked used
    assert host.match([a, b, c], 0, 3) == 3
    assert host.match([a, b, c], 1, 3) == 2  # asked from the GPU's hits on
    assert host.match([a, b, c], 0, 2) == 2  # never up to the prompt's last token
    host.match([a], 0, 1)  # used last to first: a, b, c, so c is the least recently used
    assert host.store([d]) == 1 and c not in host and {a, b, d} == {h for h in (a, b, c, d) if h in host}
    assert host.match([a, b, c], 0, 3) == 2  # the run stops at the first block not held
    assert HostTier(0).store([a]) == 0 and len(HostTier(0)) == 0
    with pytest.raises(ValueError):
        HostTier(-1)


def test_perf_model_sizes_the_host_tier_over_every_rank():
    """GB300 TP8: a block is 54.9 MB on each of the 8 GPUs, so a 1000 GiB tier holds
    1000 x 2**30 / (8 x 54.85 MB) = 2446 blocks (~2.5M tokens) beside the GPUs' 896; one block
    comes back over NVLink-C2C (225 GB/s per GPU) in 0.24 ms where its prefill takes ~14 ms."""
    params = pm.perf_params(pm.EngineShape(kv_offload_gib=1000))
    kv = pm.kv_cache_blocks(params)
    assert (kv.block_size, kv.blocks, kv.host_blocks) == (1024, 896, 2446)
    assert kv.host_tokens == 2446 * 1024
    assert pm.host_tier_load_s(params, 1) == pytest.approx(kv.block_bytes / 225e9) == pytest.approx(2.44e-4, rel=0.01)
    assert pm.prefill_time(params, 1024) > 50 * pm.host_tier_load_s(params, 1)
    assert pm.kv_cache_blocks(pm.perf_params(pm.EngineShape())).host_blocks == 0
