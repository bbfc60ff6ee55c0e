"""Memory must fit: the weights on the GPUs, the host KV tier on the nodes.

- weights: the GPUs that hold one copy of Kimi K3 must have the memory for it. One copy spans
  TP x PP GPUs of one engine, or every DP x TP GPU of the group under expert parallelism
  (``gpus_per_model_copy``); it needs ``MODEL_MEMORY_FLOOR_GB`` of the variant (vLLM recipes:
  ~1680 GB mxfp4, ~1650 GB nvfp4; kimi-k3-and-vllm.md).
- host tier: each engine pod's memory (``engine.resources.memory`` plus its share of
  ``engine.kvOffload``, ``kvcache.offload_bytes_per_pod``) must fit one node's memory, the
  accelerator profile's ``host_memory`` (960 GB on a GB300 tray: 2 Grace CPUs x 480 GB).
"""

from __future__ import annotations

from kimik3.admission.rules import Candidate, Rule, Table, example
from kimik3.api.errors import SpecError
from kimik3.engine.kvcache import offload_bytes_per_pod
from kimik3.kube.accelerators import MODEL_MEMORY_FLOOR_GB
from kimik3.kube.quantities import GIB, gibibytes, quantity_bytes
from kimik3.topology.plan import (fewest_gpus_per_model_copy, gpus_per_model_copy, gpus_per_node, profile,
                                  tensor_parallel_size)

SUGGESTED_GROUP_GPUS = (8, 16, 24, 32, 48, 64, 72)
"""Group sizes a refusal proposes (whole GB300 trays up to one NVL72 rack)."""


def weights_fit(c: Candidate) -> list[SpecError]:
    spec, topo = c.spec, c.topology
    need = MODEL_MEMORY_FLOOR_GB[spec.model.variant]
    gpus = gpus_per_model_copy(topo)
    have = gpus * profile(topo).gpu_memory_gb
    if have >= need:
        return []
    least = fewest_gpus_per_model_copy(spec)
    fit = next(x for x in SUGGESTED_GROUP_GPUS if x >= least)
    return [SpecError(
        "spec.topology",
        f"one copy of Kimi K3 ({spec.model.variant}, ~{need} GB) is spread over {gpus} {topo.accelerator} "
        f"GPUs = {have} GB: needs >= {least} GPUs; use {fit} (e.g. strategy tp with tensorParallelSize {fit}, "
        f"or dep with dataParallelSize {fit})")]


def host_tier_fits_node(c: Candidate) -> list[SpecError]:
    spec, topo = c.spec, c.topology
    tier = spec.engine.kv_offload
    if tier is None:
        return []
    node_profile = profile(topo)
    node = quantity_bytes(node_profile.host_memory)
    own = quantity_bytes(spec.engine.resources.memory) if spec.engine.resources.memory else 0
    share = offload_bytes_per_pod(spec)
    if own + share <= node:
        return []
    ranks, gpus = tensor_parallel_size(topo) * topo.pipeline_parallel_size, gpus_per_node(topo)
    most = max(0, node - own) * ranks // gpus // GIB
    mine = f" plus engine.resources.memory {spec.engine.resources.memory}" if own else ""
    return [SpecError(
        "spec.engine.kvOffload.size",
        f"the host KV tier of {tier.size} per engine puts {gibibytes(share)} on each pod (its {gpus} of the "
        f"engine's {ranks} GPUs){mine}: more than one {topo.accelerator} node's {node_profile.host_memory} "
        f"({node / GIB:.2f}Gi) of memory; use kvOffload.size <= {most}Gi"
        + (" or lower engine.resources.memory" if own else ""))]


MEMORY = Table("memory", (
    Rule(weights_fit, example(topology={"accelerator": "gb200", "tensorParallelSize": 8}), cel=("weights-fit",)),
    Rule(host_tier_fits_node, example(engine={"kvOffload": {"size": "2Ti"}}),
         operator_only="the pod's share depends on the group plan (GPUs per pod over GPUs per engine) and "
                       "on resources.memory as a quantity, which the CRD's CEL rules do not compute"),
))
