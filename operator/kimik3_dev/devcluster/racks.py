"""Simulated GPU racks: Node objects shaped like GB300 NVL72 trays (or HGX nodes), for kwok.

One Node per tray, labelled the way NVIDIA GPU Feature Discovery labels real ones
(``nvidia.com/gpu.product``, ``nvidia.com/gpu.count``, ``nvidia.com/gpu.memory`` in MiB,
``nvidia.com/gpu.clique`` = ``<clusterUUID>.<cliqueID>``, equal on all trays of one NVLink
domain), with ``nvidia.com/gpu`` capacity/allocatable from ``kimik3.kube.accelerators.PROFILES``.
Profiles without a multi-node NVLink domain (b300, b200, h200: 8-GPU x86 nodes) get no clique
label. Every node carries the annotation kwok manages (``kwok.x-k8s.io/node: fake``) and a
display-only label ``dev.kimik3.io/rack``.

Host memory per node is the profile's ``host_memory`` (``kimik3.kube.accelerators``, with its
sources); host CPUs per node (not in PROFILES; sources):
- GB300/GB200 NVL72 tray: 2 Grace CPUs x 72 Neoverse V2 cores = 144 cores (NVIDIA GB300 NVL72
  spec: 36 Grace CPUs, 2,592 cores).
- HGX/DGX 8-GPU node: 2 x 56-core Xeon = 224 hardware threads (NVIDIA DGX H200 spec: 112 cores).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from kimik3.kube.labels import CLIQUE_LABEL, GPU_RESOURCE, PRODUCT_LABEL
from kimik3.kube.accelerators import PROFILES, AcceleratorProfile

__all__ = [
    "KWOK_ANNOTATION",
    "RACK_LABEL",
    "RackShape",
    "node_manifests",
]

KWOK_ANNOTATION = ("kwok.x-k8s.io/node", "fake")
"""Annotation that marks the nodes kwok manages (``--manage-nodes-with-annotation-selector``)."""
RACK_LABEL = "dev.kimik3.io/rack"
"""Display-only label: ``rack-<n>``. Placement itself uses ``nvidia.com/gpu.clique``."""
GPU_COUNT_LABEL = "nvidia.com/gpu.count"
GPU_MEMORY_LABEL = "nvidia.com/gpu.memory"
MAX_PODS = 110
"""Pods per node (the kubelet's default ``maxPods``)."""

_HOST_CPUS: dict[str, str] = {
    # profile -> cpu cores per node; see the module docstring for sources.
    "gb300": "144",
    "gb200": "144",
    "b300": "224",
    "b200": "224",
    "h200": "224",
}


@dataclass(frozen=True)
class RackShape:
    """What ``kimik3 dev up`` simulates: ``racks`` x ``trays_per_rack`` nodes of ``profile``."""

    profile: str = "gb300"
    racks: int = 2
    trays_per_rack: int = 18
    cluster_uuid: str = ""
    """``<clusterUUID>`` part of the clique label; a fresh uuid4 when empty."""

    def __post_init__(self) -> None:
        if self.profile not in PROFILES:
            raise ValueError(f"unknown profile {self.profile!r}; choose one of {', '.join(PROFILES)}")
        if self.racks < 1 or self.trays_per_rack < 1:
            raise ValueError("racks and trays per rack must be >= 1")
        p = PROFILES[self.profile]
        if p.multi_node_nvlink and self.trays_per_rack > p.nvlink_domain_nodes:
            raise ValueError(f"a {self.profile} NVLink domain holds at most {p.nvlink_domain_nodes} trays, "
                             f"not {self.trays_per_rack}")
        if not self.cluster_uuid:
            object.__setattr__(self, "cluster_uuid", str(uuid.uuid4()))

    @property
    def accelerator(self) -> AcceleratorProfile:
        return PROFILES[self.profile]

    @property
    def nodes(self) -> int:
        return self.racks * self.trays_per_rack

    @property
    def gpus(self) -> int:
        return self.nodes * self.accelerator.gpus_per_node

    def clique(self, rack: int) -> str | None:
        """The ``nvidia.com/gpu.clique`` value of rack ``rack``, or None (no multi-node NVLink)."""
        return f"{self.cluster_uuid}.{rack}" if self.accelerator.multi_node_nvlink else None

    def node_name(self, rack: int, tray: int) -> str:
        return f"{self.profile}-r{rack}-t{tray:02d}"


def _gpu_memory_mib(profile: AcceleratorProfile) -> str:
    # GFD's nvidia.com/gpu.memory is the framebuffer in MiB; PROFILES holds GB (10^9 bytes).
    return str(profile.gpu_memory_gb * 10**9 // 2**20)


def node_manifests(shape: RackShape) -> list[dict[str, Any]]:
    """The Node objects of ``shape`` (racks in order, trays in order), status included: the API
    server keeps a Node's status on create, and kwok's node-initialize stage keeps the given
    capacity, allocatable and architecture."""
    p = shape.accelerator
    resources = {"cpu": _HOST_CPUS[shape.profile], "memory": p.host_memory, "pods": str(MAX_PODS), GPU_RESOURCE: str(p.gpus_per_node)}
    out: list[dict[str, Any]] = []
    for rack in range(shape.racks):
        for tray in range(shape.trays_per_rack):
            name = shape.node_name(rack, tray)
            labels = {
                "kubernetes.io/arch": p.arch,
                "kubernetes.io/os": "linux",
                "kubernetes.io/hostname": name,
                "node.kubernetes.io/instance-type": f"{shape.profile}-simulated",
                PRODUCT_LABEL: p.product_label,
                GPU_COUNT_LABEL: str(p.gpus_per_node),
                GPU_MEMORY_LABEL: _gpu_memory_mib(p),
                RACK_LABEL: f"rack-{rack}",
            }
            clique = shape.clique(rack)
            if clique:
                labels[CLIQUE_LABEL] = clique
            out.append({
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": name, "labels": labels, "annotations": {KWOK_ANNOTATION[0]: KWOK_ANNOTATION[1]}},
                "spec": {},
                "status": {
                    "capacity": dict(resources),
                    "allocatable": dict(resources),
                    "nodeInfo": {"architecture": p.arch, "operatingSystem": "linux"},
                },
            })
    return out
