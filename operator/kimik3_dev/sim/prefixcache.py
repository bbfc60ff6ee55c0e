"""One engine's prefix cache, kept the way vLLM's (v1 ``KVCacheManager``, ``BlockPool``; read in the
vLLM 0.33.0 wheel) keeps it.

A prompt is cut into full blocks of ``block_size`` token ids (a partial last block is never
cached); block i is named by a chained hash, ``sha256(hash of block i-1 || its token ids)``, so
equal hashes mean equal prefixes up to and including that block (vLLM: ``hash_block_tokens`` in
``vllm/v1/core/kv_cache_utils.py``, sha256 of the parent hash and the block's token ids; ours
packs the ids as 8-byte integers instead of pickling a tuple, and the first block's parent is
empty rather than a per-process random seed).

The cache holds ``capacity`` blocks. A block used by a running request is pinned (a reference
count); a block no request uses stays cached and is evictable, least recently freed first, and a
request frees its blocks last-first, so a prefix's tail is evicted before its head (vLLM's free
block queue). A lookup matches the longest run of leading hashes held; it never matches the
prompt's last token (vLLM recomputes it for the logits: ``KVCacheManager.get_computed_blocks``,
``max_cache_hit_length = num_tokens - 1``).

The host tier (``HostTier``, ``spec.engine.kvOffload``: vLLM 0.33's ``OffloadingConnector`` with
its native CPU backend, read in the wheel: ``distributed/kv_transfer/kv_connector/v1/offloading/``,
``v1/kv_offload/cpu/``) holds ``capacity`` blocks by hash in host memory, least recently used
evicted first (the CPU manager's default ``eviction_policy: lru``). It is written through, not
filled by evictions: the connector stores every full prompt block as soon as a step has computed
it (``build_connector_meta`` offers the request's new blocks to ``prepare_store``; a block already
held is not stored again), so it holds what the GPU cache holds as well as what the GPU evicted.
A request's lookup there starts after the blocks the GPU cache holds
(``get_num_new_matched_tokens`` is asked from the local hit on) and takes the leading run found, at
most up to the prompt's last token; those blocks are loaded back into the GPU cache.

Simplifications (not vLLM): only prompt blocks are cached (vLLM also caches blocks that generated
tokens fill); the capacity counts cached full blocks only, not a running request's partial block
or its decode tokens; and when every block is pinned, a new block is simply not cached (vLLM
would wait or preempt a request to make room).
"""

from __future__ import annotations

import collections
import hashlib
from array import array
from collections.abc import Sequence


def block_hashes(token_ids: Sequence[int], block_size: int) -> list[bytes]:
    """The chained hashes of the full ``block_size``-token blocks of ``token_ids`` (ids in
    [-2**63, 2**63); 32 bytes each)."""
    out: list[bytes] = []
    parent = b""
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = hashlib.sha256(parent + array("q", token_ids[start:start + block_size]).tobytes()).digest()
        out.append(parent)
    return out


class PrefixCache:
    """Cached blocks by hash: pinned ones with their reference counts, free ones in eviction order."""

    def __init__(self, capacity: int, block_size: int):
        if capacity < 0 or block_size < 1:
            raise ValueError(f"capacity must be >= 0 blocks (got {capacity}) and block_size >= 1 token (got {block_size})")
        self.capacity = capacity
        self.block_size = block_size
        self._pinned: dict[bytes, int] = {}
        self._free: collections.OrderedDict[bytes, None] = collections.OrderedDict()
        """Evictable blocks, the next to evict first."""

    def __len__(self) -> int:
        return len(self._pinned) + len(self._free)

    def __contains__(self, block: bytes) -> bool:
        return block in self._pinned or block in self._free

    def match(self, hashes: Sequence[bytes], prompt_tokens: int) -> int:
        """Blocks of ``hashes`` (a prompt of ``prompt_tokens`` tokens) found cached: the leading run
        held, at most ``(prompt_tokens - 1) // block_size`` (the last token is always computed)."""
        limit = min(len(hashes), max(0, prompt_tokens - 1) // self.block_size)
        hits = 0
        while hits < limit and hashes[hits] in self:
            hits += 1
        return hits

    def acquire(self, hashes: Sequence[bytes]) -> int:
        """Pin ``hashes`` in order for a request: a cached block gains a reference, a new one is
        stored (evicting the least recently freed block when full). Stops at the first block that
        cannot be stored (every block pinned); returns how many were pinned."""
        for n, block in enumerate(hashes):
            if block in self._pinned:
                self._pinned[block] += 1
                continue
            if block in self._free:
                del self._free[block]
            elif len(self) >= self.capacity:
                if not self._free:
                    return n
                self._free.popitem(last=False)
            self._pinned[block] = 1
        return len(hashes)

    def release(self, hashes: Sequence[bytes]) -> None:
        """Drop a request's references to ``hashes`` (the blocks it pinned, in prompt order); the
        blocks no request holds any more become evictable, the last block first."""
        for block in reversed(hashes):
            count = self._pinned[block] - 1
            if count:
                self._pinned[block] = count
            else:
                del self._pinned[block]
                self._free[block] = None


class HostTier:
    """The host-memory tier of one engine: block hashes, least recently used first (module docstring)."""

    def __init__(self, capacity: int):
        if capacity < 0:
            raise ValueError(f"capacity must be >= 0 blocks (got {capacity})")
        self.capacity = capacity
        self._blocks: collections.OrderedDict[bytes, None] = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, block: bytes) -> bool:
        return block in self._blocks

    def match(self, hashes: Sequence[bytes], start: int, limit: int) -> int:
        """Blocks held from ``hashes[start]`` on: the leading run, ending before index ``limit``
        (a prompt's last token is always computed: ``PrefixCache.match``'s limit). The blocks found
        become the most recently used."""
        found = start
        while found < min(limit, len(hashes)) and hashes[found] in self._blocks:
            self._blocks.move_to_end(hashes[found])
            found += 1
        return found - start

    def store(self, hashes: Sequence[bytes]) -> int:
        """Store ``hashes`` (blocks a step computed), evicting the least recently used beyond the
        capacity; a block held already is only marked used. Returns how many were new."""
        new = 0
        for block in hashes:
            if block in self._blocks:
                self._blocks.move_to_end(block)
                continue
            if self.capacity == 0:
                return new
            if len(self._blocks) >= self.capacity:
                self._blocks.popitem(last=False)
            self._blocks[block] = None
            new += 1
        return new
