"""The parallel plan of one engine group, derived from the spec's topology.

Pure derivation, no refusals: the shape rules live in ``kimik3.admission`` (which calls the
functions here for the values it checks, e.g. the effective TP), and ``plan_group(spec)`` is
called on a spec admission has already checked. Every function here is total on any spec the
schema accepts (a shape that does not fit still yields numbers, which admission then refuses).

Launch shapes (vLLM multi-node without Ray, see kimi-k3-and-vllm.md):
- tp: one engine of TP x PP GPUs over N = TP x PP / GPUs-per-node nodes (``--nnodes``/``--node-rank``).
- tp-dp: TP inside a node, GPUs-per-node / TP data-parallel ranks per node, DP / that many nodes.
- dep: DP = the group's GPUs, TP=1 per rank, expert parallelism, GPUs-per-node ranks per node.
"""

from __future__ import annotations

from dataclasses import dataclass

from kimik3.api.v1alpha1 import KimiK3DeploymentSpec, TopologySpec
from kimik3.kube.accelerators import MODEL_MEMORY_FLOOR_GB, PROFILES, AcceleratorProfile


@dataclass(frozen=True)
class GroupPlan:
    """One engine group: a LeaderWorkerSet group of ``nodes_per_group`` pods."""

    profile: AcceleratorProfile
    strategy: str
    tensor_parallel_size: int
    pipeline_parallel_size: int
    data_parallel_size: int
    """Data-parallel engines in the group (1 for tp)."""
    data_parallel_size_local: int
    """Data-parallel engines per node."""
    expert_parallel: bool
    gpus_per_node: int
    """GPUs each pod requests (``nvidia.com/gpu``)."""
    nodes_per_group: int
    """Pods per group (LeaderWorkerSet size), leader included."""

    @property
    def gpus_per_group(self) -> int:
        return self.gpus_per_node * self.nodes_per_group

    @property
    def multi_node(self) -> bool:
        return self.nodes_per_group > 1

    @property
    def needs_compute_domain(self) -> bool:
        """Multi-node groups on NVL72 trays share GPU memory over NVLink through IMEX channels
        that a ComputeDomain provides; single-node groups and HGX nodes do not need one."""
        return self.multi_node and self.profile.multi_node_nvlink

    @property
    def clique_placement(self) -> bool:
        """Each group alone inside one NVLink domain (``nvidia.com/gpu.clique``)."""
        return self.needs_compute_domain


def profile(topo: TopologySpec) -> AcceleratorProfile:
    """The accelerator profile the topology names."""
    return PROFILES[topo.accelerator]


def tensor_parallel_size(topo: TopologySpec) -> int:
    """The TP each engine runs: with tp as set (default 8 = 2 GB300 trays); with tp-dp as set
    (default one node); with dep always 1 (admission refuses any other value). The CEL twin is
    ``_tp_expr`` in api/v1alpha1.py."""
    if topo.strategy == "dep":
        return 1
    if topo.tensor_parallel_size is not None:
        return topo.tensor_parallel_size
    return 8 if topo.strategy == "tp" else profile(topo).gpus_per_node


def expert_parallel(topo: TopologySpec) -> bool:
    """``--enable-expert-parallel``: always with dep, as set with tp-dp, never with tp."""
    return topo.strategy == "dep" or (topo.strategy == "tp-dp" and bool(topo.expert_parallel))


def data_parallel_size(topo: TopologySpec) -> int:
    """Data-parallel engines of the group: 1 for tp, else ``dataParallelSize`` (1 when unset)."""
    return 1 if topo.strategy == "tp" else topo.data_parallel_size or 1


def data_parallel_ranks_per_node(topo: TopologySpec) -> int:
    """DP ranks one node holds before the group's DP bounds it: GPUs per node / TP (1 when TP
    does not divide a node, a shape admission refuses)."""
    g, tp = profile(topo).gpus_per_node, tensor_parallel_size(topo)
    if topo.strategy == "tp":
        return 1
    return g // tp if g % tp == 0 else 1


def data_parallel_size_local(topo: TopologySpec) -> int:
    """DP engines per node (``--data-parallel-size-local``): 1 for tp."""
    return min(data_parallel_ranks_per_node(topo), data_parallel_size(topo))


def nodes_per_group(topo: TopologySpec) -> int:
    """Pods of one group: TP x PP / GPUs per node for tp (at least 1), DP / DP-per-node otherwise."""
    if topo.strategy == "tp":
        return max(1, tensor_parallel_size(topo) * topo.pipeline_parallel_size // profile(topo).gpus_per_node)
    return max(1, data_parallel_size(topo) // data_parallel_size_local(topo))


def gpus_per_node(topo: TopologySpec) -> int:
    """GPUs each pod requests: the engine's TP x PP when it fits one node, else a whole node."""
    if topo.strategy == "tp":
        return min(tensor_parallel_size(topo) * topo.pipeline_parallel_size, profile(topo).gpus_per_node)
    return tensor_parallel_size(topo) * data_parallel_size_local(topo)


def gpus_per_model_copy(topo: TopologySpec) -> int:
    """GPUs that together hold one copy of the weights: TP x PP of one engine, or all DP x TP
    GPUs of the group under expert parallelism (the experts spread over every rank)."""
    if expert_parallel(topo):
        return data_parallel_size(topo) * tensor_parallel_size(topo)
    return tensor_parallel_size(topo) * topo.pipeline_parallel_size


def fewest_gpus_per_model_copy(spec: KimiK3DeploymentSpec) -> int:
    """Fewest GPUs of the spec's accelerator whose memory holds one copy of Kimi K3
    (``MODEL_MEMORY_FLOOR_GB`` of the variant / HBM per GPU, rounded up)."""
    return -(-MODEL_MEMORY_FLOOR_GB[spec.model.variant] // profile(spec.topology).gpu_memory_gb)


def plan_group(spec: KimiK3DeploymentSpec) -> GroupPlan:
    """The plan of one group of an admitted spec (``kimik3.admission.admit`` checked its shape)."""
    topo = spec.topology
    return GroupPlan(profile(topo), topo.strategy, tensor_parallel_size(topo), topo.pipeline_parallel_size,
                     data_parallel_size(topo), data_parallel_size_local(topo), expert_parallel(topo),
                     gpus_per_node(topo), nodes_per_group(topo))
