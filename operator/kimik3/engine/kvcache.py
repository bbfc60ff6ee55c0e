"""How vLLM 0.33 caches Kimi K3's prompts: the fact both the perf model (``autoscaler.perfmodel``)
and the endpoint picker's configuration (``render.routing``) build on."""

from __future__ import annotations

KV_BLOCK_ALIGNMENT = 128
"""Tokens a prefix-cache block size is a multiple of: vLLM 0.33.0 raises a hybrid MLA model's
attention block size to a multiple of 128 tokens (``Platform._align_hybrid_block_size`` in
``vllm/platforms/interface.py``: the TRTLLM/FlashInfer MLA decode kernels'), the K3 recipe's
prefix-match unit on Blackwell. K3's block itself is a larger multiple, raised until one page
holds a KDA layer's state (``autoscaler.perfmodel.kv_cache_blocks``: 1024 tokens at GB300 TP8, 512
at TP16); a prompt is cached, and found again, in whole blocks."""
