"""Accelerator profiles: what one Kubernetes node of each GPU system offers.

Sources (see ../shared/reference/gb300-on-kubernetes.md and kimi-k3-and-vllm.md):
- GB300 / GB200 NVL72: a compute tray is one node with 4 GPUs (288 GB / 186 GB HBM3e) and Grace
  CPUs (arm64); 18 trays share one NVLink domain, labelled by GPU Feature Discovery with one
  ``nvidia.com/gpu.clique`` value, and multi-node NVLink needs a ComputeDomain.
- B300 / B200 / H200 HGX: 8-GPU x86 nodes (288 / 180 / 141 GB) whose NVLink domain ends at the node.
- vLLM 0.33.0 runs the megakernel ("latency_specialized") decode path only on the SM100/SM103
  family (B200, B300, GB200, GB300), not on H200 (SM90).
- Host memory per node (``host_memory``, the node's memory capacity): a GB300/GB200 NVL72 tray
  has 2 Grace CPUs with up to 480 GB LPDDR5X each, 960 GB (NVIDIA GB300 NVL72 spec: 36 Grace CPUs,
  up to 17 TB LPDDR5X per rack; the Grace CPU Superchip: up to 960 GB); an 8-GPU HGX/DGX node
  2 TiB (NVIDIA DGX H200/B200/B300 specs: 2 TB system memory).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Accelerator = Literal["gb300", "gb200", "b300", "b200", "h200"]


@dataclass(frozen=True)
class AcceleratorProfile:
    """One node of a GPU system as Kubernetes sees it."""

    name: str
    gpus_per_node: int
    gpu_memory_gb: int
    """HBM per GPU, GB (10^9 bytes)."""
    product_label: str
    """Value of ``nvidia.com/gpu.product`` set by GPU Feature Discovery."""
    arch: Literal["arm64", "amd64"]
    multi_node_nvlink: bool
    """True when the NVLink domain spans trays (NVL72): multi-node groups need a ComputeDomain
    and must stay inside one clique."""
    nvlink_domain_nodes: int
    """Nodes in one NVLink domain: 18 trays for NVL72, 1 for an HGX node."""
    megakernel_capable: bool
    """SM100/SM103 family: vLLM 0.33's specialised decode path can run here."""
    host_memory: str
    """CPU memory of one node, a Kubernetes quantity (the node's ``memory`` capacity)."""


PROFILES: dict[str, AcceleratorProfile] = {
    p.name: p
    for p in (
        AcceleratorProfile("gb300", 4, 288, "NVIDIA-GB300", "arm64", True, 18, True, "960G"),
        AcceleratorProfile("gb200", 4, 186, "NVIDIA-GB200", "arm64", True, 18, True, "960G"),
        AcceleratorProfile("b300", 8, 288, "NVIDIA-B300", "amd64", False, 1, True, "2Ti"),
        AcceleratorProfile("b200", 8, 180, "NVIDIA-B200", "amd64", False, 1, True, "2Ti"),
        AcceleratorProfile("h200", 8, 141, "NVIDIA-H200", "amd64", False, 1, False, "2Ti"),
    )
}

MODEL_MEMORY_FLOOR_GB: dict[str, int] = {"mxfp4": 1680, "nvfp4": 1650}
"""GPU memory one Kimi K3 engine needs in total, GB, by weight variant (vLLM recipes: ~1680 GB
for the MXFP4 checkpoint, ~1650 GB for RedHatAI/Kimi-K3-NVFP4; i.e. >= 8 GB300/B300-class GPUs
or >= 16 GB200/B200-class GPUs)."""
