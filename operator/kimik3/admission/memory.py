"""The weights must fit: the GPUs that hold one copy of Kimi K3 must have the memory for it.

One copy spans TP x PP GPUs of one engine, or every DP x TP GPU of the group under expert
parallelism (``gpus_per_model_copy``); it needs ``MODEL_MEMORY_FLOOR_GB`` of the variant (vLLM
recipes: ~1680 GB mxfp4, ~1650 GB nvfp4; kimi-k3-and-vllm.md).
"""

from __future__ import annotations

from kimik3.admission.rules import Candidate, Rule, Table, example
from kimik3.api.errors import SpecError
from kimik3.kube.accelerators import MODEL_MEMORY_FLOOR_GB
from kimik3.topology.plan import fewest_gpus_per_model_copy, gpus_per_model_copy, profile

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


MEMORY = Table("memory", (
    Rule(weights_fit, example(topology={"accelerator": "gb200", "tensorParallelSize": 8}), cel=("weights-fit",)),
))
