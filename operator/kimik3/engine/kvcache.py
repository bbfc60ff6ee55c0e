"""How vLLM 0.33 caches Kimi K3's prompts: the facts the perf model (``autoscaler.perfmodel``),
the endpoint picker's configuration (``render.routing``) and the engine pods (``render.leaderworkerset``)
build on: the block alignment, each engine's cache in blocks (``kv_blocks``, ``spec_kv_blocks``) and
the host-memory tier of ``spec.engine.kvOffload``.

The GPU cache (``kv_blocks``)
=============================
With ``--enable-prefix-caching`` vLLM caches a hybrid model like K3 in ``mamba_cache_mode="align"``
(read in the vLLM 0.33.0 wheel: ``Platform._align_hybrid_block_size`` in ``vllm/platforms/interface.py``,
the KDA state from ``MambaStateShapeCalculator.kda_state_shape``/``kda_state_dtype`` in
``vllm/model_executor/layers/mamba/mamba_utils.py``; not seen on a GPU, where vLLM logs "Setting
attention block size to N tokens"): every layer gets pages of one size, the attention block size
is raised until one attention page holds a KDA layer's whole state,
``block = alignment x ceil(kda_page / (alignment x mla_page_per_token))``, and the KDA state is
kept at each block boundary (``mamba_block_size = block_size``). So a cached block of ``block``
tokens costs one page in each of the 93 layers on every GPU of the engine: the MLA layers' latent
cache of its tokens (replicated on every TP rank) and the KDA layers' state at its end (1/TP of it
per rank, padded to the page). vLLM's allocator groups the layers into equal-sized groups
(24 + 69 -> 4 groups of 24, one padded slot): ignored here.

The host tier (``kvOffload``)
=============================
vLLM 0.33's OffloadingConnector (native CPU backend, ``v1/kv_offload/cpu/spec.py``) sizes its
buffer as ``--kv-offloading-size`` GiB over all ranks of an engine; each block takes every rank's
page (``worker_kv_bytes_per_block x world_size``; the single-copy layout of MLA's replicated latent
cache applies only to one-node engines, ``replicated_layout``, not to K3's multi-tray TP groups): a
tier of S GiB holds ``S GiB / (block_bytes x TP x PP)`` blocks. A block found there is copied
back to each GPU (``host_load_s``) instead of being prefilled again.
"""

from __future__ import annotations

from dataclasses import dataclass

from kimik3.api.v1alpha1 import KimiK3DeploymentSpec
from kimik3.kube.accelerators import MODEL_MEMORY_FLOOR_GB, PROFILES
from kimik3.kube.quantities import GIB, quantity_bytes
from kimik3.topology.plan import gpus_per_model_copy, gpus_per_node, tensor_parallel_size

KV_BLOCK_ALIGNMENT = 128
"""Tokens a prefix-cache block size is a multiple of: vLLM 0.33.0 raises a hybrid MLA model's
attention block size to a multiple of 128 tokens (``Platform._align_hybrid_block_size`` in
``vllm/platforms/interface.py``: the TRTLLM/FlashInfer MLA decode kernels'), the K3 recipe's
prefix-match unit on Blackwell. K3's block itself is a larger multiple, raised until one page
holds a KDA layer's state (``kv_blocks``: 1024 tokens at GB300 TP8, 512
at TP16); a prompt is cached, and found again, in whole blocks."""


def offload_gib(spec: KimiK3DeploymentSpec) -> int:
    """``--kv-offloading-size`` (GiB, whole): ``spec.engine.kvOffload.size`` (``Gi`` or ``Ti``); 0 when unset."""
    tier = spec.engine.kv_offload
    return 0 if tier is None else quantity_bytes(tier.size) // GIB


def offload_bytes_per_pod(spec: KimiK3DeploymentSpec) -> int:
    """Host memory the tier takes on each pod of a group, bytes: every rank of an engine (its TP x PP
    GPUs) holds ``1 / (TP x PP)`` of the engine's ``--kv-offloading-size`` (vLLM 0.33
    ``CPUOffloadingSpec``: one slot per worker in every chunk of the region, each worker pre-faulting
    its own slots; a multi-node engine's ranks do not share one copy), and a pod holds
    ``gpus_per_node`` ranks: half the size on each tray of a TP8 group, 4x the size on a DEP pod
    (one engine per GPU)."""
    topo = spec.topology
    return offload_gib(spec) * GIB * gpus_per_node(topo) // (tensor_parallel_size(topo) * topo.pipeline_parallel_size)


def offload_shm_bytes(spec: KimiK3DeploymentSpec) -> int:
    """What the tier adds to each pod's ``/dev/shm``, bytes: vLLM 0.33 maps the region from
    ``/dev/shm/vllm_offload_<engine>.mmap`` (``SharedOffloadRegion``), a file of the engine's whole
    size on every node holding one of its ranks, and refuses to start unless ``/dev/shm`` has that
    much free (``check_shm_free_space``) although the node fills only its ranks' share: the larger of
    the whole size and the pod's share (``offload_bytes_per_pod``)."""
    return max(offload_gib(spec) * GIB, offload_bytes_per_pod(spec))


MLA_LAYERS = 24
KDA_LAYERS = 69
NUM_LAYERS = MLA_LAYERS + KDA_LAYERS
"""Kimi K3's decoder layers: 69 KDA + 24 gated MLA (kimi-k3-and-vllm.md)."""
MLA_BYTES_PER_TOKEN_LAYER = (512 + 64) * 1
"""One MLA layer's cache of one token: 512 latent + 64 rope values, 1 byte each (FP8 KV cache)."""
KDA_HEADS = 64
KDA_HEAD_DIM = 128
KDA_CONV_KERNEL = 4
"""Assumption: KDA's short convolution kernel (``short_conv_kernel_size``, vLLM's default in
``kda_state_shape``; the K3 config's value was not read)."""

HOST_TO_GPU_BYTES_PER_S: dict[str, float] = {
    "gb300": 900e9 / 2 / 2, "gb200": 900e9 / 2 / 2,
    "b300": 64e9, "b200": 64e9, "h200": 64e9,
}
"""Host-to-GPU copy bandwidth of one GPU, bytes/s. GB300/GB200 NVL72: each Grace CPU reaches its
2 GPUs over NVLink-C2C, 900 GB/s bidirectional (NVIDIA Grace Blackwell superchip and GB300 NVL72
specs; gb300-on-kubernetes.md: 2 Grace CPUs and 4 GPUs per tray), so 450 GB/s host-to-GPU shared
by 2 GPUs: 225 GB/s each. HGX x86 nodes: PCIe Gen5 x16, ~64 GB/s each way. Peak figures: a load
is assumed to run at them (no transfer overhead)."""


@dataclass(frozen=True)
class KVBlocks:
    """The prefix cache of one engine (one DP rank) as vLLM lays it out (module docstring)."""

    block_size: int
    """Tokens per block: the unit prompt blocks are hashed and cached in."""
    block_bytes: int
    """Bytes one cached block takes on each GPU of the engine (a page in each of the 93 layers)."""
    blocks: int
    """Blocks the GPUs hold: their free KV memory per GPU / ``block_bytes``."""
    host_blocks: int = 0
    """Blocks the host tier holds (``kvOffload``; 0 without one)."""

    @property
    def tokens(self) -> int:
        return self.blocks * self.block_size

    @property
    def host_tokens(self) -> int:
        return self.host_blocks * self.block_size


def free_bytes_per_gpu(accelerator: str, variant: str, gpu_memory_utilization: float, gpus_holding_weights: int) -> float:
    """KV-cache memory of one GPU, bytes: its HBM x ``gpu_memory_utilization`` minus its share of one
    copy of the weights (``MODEL_MEMORY_FLOOR_GB`` over the GPUs that hold a copy), never below 0."""
    weights_gb = MODEL_MEMORY_FLOOR_GB.get(variant, MODEL_MEMORY_FLOOR_GB["mxfp4"]) / max(1, gpus_holding_weights)
    return max(0.0, PROFILES[accelerator].gpu_memory_gb * gpu_memory_utilization - weights_gb) * 1e9


def kv_blocks(accelerator: str, variant: str, gpu_memory_utilization: float, tensor_parallel_size: int,
              pipeline_parallel_size: int, gpus_holding_weights: int, speculative_tokens: int = 0,
              offload_gib: int = 0) -> KVBlocks:
    """The prefix cache of each engine of a group (module docstring).

    Per GPU (every TP rank holds the whole MLA latent cache and 1/TP of each KDA state):
    ``kda_page = 64/TP heads x 128 x 128 x 4 B (FP32 recurrent state) + 3 (q, k, v) x 64/TP x 128
    channels x (KDA_CONV_KERNEL - 1 + k) x 2 B (BF16 conv state, k = speculative tokens)``;
    ``mla_page_per_token = 576 B`` (FP8);
    ``block_size = KV_BLOCK_ALIGNMENT x ceil(kda_page / (KV_BLOCK_ALIGNMENT x 576))`` (vLLM's align
    mode); ``block_bytes = 93 layers x block_size x 576``; ``blocks = free_bytes_per_gpu //
    block_bytes``; ``host_blocks = offload_gib GiB // (block_bytes x TP x PP)``. GB300 TP8 mxfp4 at
    0.9: 1024-token blocks of 54.9 MB, 896 of them (~0.92M tokens), with or without DSpark's 7
    drafts; a 1000 GiB host tier adds 2446 (~2.5M tokens); TP16: 512-token blocks."""
    tp = max(1, tensor_parallel_size)
    heads = max(1, KDA_HEADS // tp)
    conv_columns = KDA_CONV_KERNEL - 1 + speculative_tokens
    kda_page = heads * KDA_HEAD_DIM * KDA_HEAD_DIM * 4 + 3 * heads * KDA_HEAD_DIM * conv_columns * 2
    unit = KV_BLOCK_ALIGNMENT * MLA_BYTES_PER_TOKEN_LAYER
    block_size = KV_BLOCK_ALIGNMENT * -(-kda_page // unit)
    block_bytes = NUM_LAYERS * block_size * MLA_BYTES_PER_TOKEN_LAYER
    free = free_bytes_per_gpu(accelerator, variant, gpu_memory_utilization, gpus_holding_weights)
    host = offload_gib * GIB // (block_bytes * tp * max(1, pipeline_parallel_size))
    return KVBlocks(block_size, block_bytes, int(free // block_bytes), host)


def spec_kv_blocks(spec: KimiK3DeploymentSpec) -> KVBlocks:
    """``kv_blocks`` of each engine of an admitted spec's groups."""
    topo, sd = spec.topology, spec.speculative_decoding
    return kv_blocks(topo.accelerator, spec.model.variant, spec.engine.gpu_memory_utilization,
                     tensor_parallel_size(topo), topo.pipeline_parallel_size, gpus_per_model_copy(topo),
                     (sd.num_speculative_tokens or 0) if sd.method != "none" else 0, offload_gib(spec))


def host_load_s(accelerator: str, kv: KVBlocks, blocks: int) -> float:
    """Seconds to copy ``blocks`` blocks from the host tier back to the GPUs: every GPU of the
    engine loads its own page of each block at once, at ``HOST_TO_GPU_BYTES_PER_S``."""
    return blocks * kv.block_bytes / HOST_TO_GPU_BYTES_PER_S[accelerator]
