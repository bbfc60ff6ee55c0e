"""Topology shapes per strategy: which TP/PP/DP sizes launch on the accelerator's nodes.

vLLM 0.33 multi-node launch without Ray (kimi-k3-and-vllm.md): tp spans whole nodes or fits in
one; tp-dp keeps TP inside a node and packs GPUs-per-node / TP ranks per node; dep runs TP=1
ranks, GPUs-per-node of them per node. A group on NVL72 trays must stay inside one rack (its
NVLink domain, gb300-on-kubernetes.md). Each refusal names the values that would fit (and hold
the model: suggestions never go below ``fewest_gpus_per_model_copy``).
"""

from __future__ import annotations

from kimik3.admission.rules import Candidate, Rule, Table, example, refuse
from kimik3.api.errors import SpecError
from kimik3.topology.plan import (
    data_parallel_ranks_per_node,
    fewest_gpus_per_model_copy,
    nodes_per_group,
    profile,
    tensor_parallel_size,
)

PATH = "spec.topology"


def tp_takes_no_data_parallel(c: Candidate) -> list[SpecError]:
    return refuse(c.topology.strategy == "tp" and c.topology.data_parallel_size not in (None, 1),
                  f"{PATH}.dataParallelSize", "strategy tp takes no dataParallelSize: use strategy tp-dp or dep")


def tp_fits_one_node_or_whole_nodes(c: Candidate) -> list[SpecError]:
    topo = c.topology
    if topo.strategy != "tp":
        return []
    g, pp = profile(topo).gpus_per_node, topo.pipeline_parallel_size
    gpus = tensor_parallel_size(topo) * pp
    if gpus <= g or gpus % g == 0:
        return []
    fits = [x for x in range(g, 73, g) if x % pp == 0 and x >= fewest_gpus_per_model_copy(c.spec)][:2]
    return [SpecError(f"{PATH}.tensorParallelSize",
                      f"TP x PP = {gpus} GPUs neither fits one {topo.accelerator} node ({g} GPUs) nor fills whole "
                      f"nodes: use {' or '.join(str(x // pp) for x in fits)}")]


def tp_has_no_expert_parallel(c: Candidate) -> list[SpecError]:
    return refuse(c.topology.strategy == "tp" and bool(c.topology.expert_parallel), f"{PATH}.expertParallel",
                  "strategy tp has no expert parallelism: use strategy dep or tp-dp")


def dep_fills_whole_nodes(c: Candidate) -> list[SpecError]:
    topo = c.topology
    dp, g = topo.data_parallel_size, profile(topo).gpus_per_node
    if topo.strategy != "dep" or dp is None or dp % g == 0:
        return []
    least = fewest_gpus_per_model_copy(c.spec)
    lower, upper = (dp // g) * g, (dp // g + 1) * g
    fit = " or ".join(str(x) for x in (lower, max(upper, -(-least // g) * g)) if x >= least)
    return [SpecError(f"{PATH}.dataParallelSize",
                      f"DP={dp} does not divide into {topo.accelerator} nodes of {g} GPUs: use {fit}")]


def data_parallel_size_required(c: Candidate) -> list[SpecError]:
    return refuse(c.topology.strategy != "tp" and c.topology.data_parallel_size is None, f"{PATH}.dataParallelSize",
                  f"strategy {c.topology.strategy} needs dataParallelSize")


def tp_dp_keeps_tp_inside_a_node(c: Candidate) -> list[SpecError]:
    topo = c.topology
    g, tp = profile(topo).gpus_per_node, tensor_parallel_size(topo)
    if topo.strategy != "tp-dp" or g % tp == 0:
        return []
    divisors = ", ".join(str(d) for d in range(1, g + 1) if g % d == 0)
    return [SpecError(f"{PATH}.tensorParallelSize",
                      f"tp-dp keeps TP inside a node: TP={tp} must divide the {g} GPUs of a {topo.accelerator} node "
                      f"(use {divisors}), or use strategy tp for TP across nodes")]


def pipeline_parallel_with_tp_only(c: Candidate) -> list[SpecError]:
    return refuse(c.topology.strategy != "tp" and c.topology.pipeline_parallel_size != 1,
                  f"{PATH}.pipelineParallelSize", "pipeline parallelism is supported with strategy tp only")


def tp_dp_fills_whole_nodes(c: Candidate) -> list[SpecError]:
    topo = c.topology
    g, tp, dp = profile(topo).gpus_per_node, tensor_parallel_size(topo), topo.data_parallel_size
    if topo.strategy != "tp-dp" or g % tp or dp is None:
        return []  # a TP that does not divide a node is tp_dp_keeps_tp_inside_a_node's
    per_node = data_parallel_ranks_per_node(topo)
    if dp % per_node == 0:
        return []
    # With expert parallelism one copy of the weights spans all DP x TP GPUs.
    floor = -(-fewest_gpus_per_model_copy(c.spec) // tp) if topo.expert_parallel else 1
    fits = [x for x in (dp - dp % per_node, dp + per_node - dp % per_node) if x >= max(per_node, floor)]
    if not fits:
        fits = [-(-max(floor, per_node) // per_node) * per_node]
    return [SpecError(f"{PATH}.dataParallelSize",
                      f"with TP={tp} a {topo.accelerator} node holds {per_node} DP ranks: DP={dp} must be a multiple "
                      f"of {per_node} (use {' or '.join(map(str, fits))})")]


def dep_runs_tp_one(c: Candidate) -> list[SpecError]:
    return refuse(c.topology.strategy == "dep" and c.topology.tensor_parallel_size not in (None, 1),
                  f"{PATH}.tensorParallelSize",
                  "strategy dep runs TP=1 per rank: set dataParallelSize to the group's GPUs")


def group_within_one_rack(c: Candidate) -> list[SpecError]:
    topo = c.topology
    p, nodes = profile(topo), nodes_per_group(topo)
    return refuse(p.multi_node_nvlink and nodes > p.nvlink_domain_nodes, PATH,
                  f"a group of {nodes} {topo.accelerator} trays exceeds one NVL72 rack ({p.nvlink_domain_nodes} trays)")


# Reported by strategy: tp, then what tp-dp and dep share, dep, tp-dp, and the rack bound.
SHAPE = Table("shape", (
    Rule(tp_takes_no_data_parallel, example(topology={"strategy": "tp", "dataParallelSize": 2}),
         cel=("tp-no-data-parallel",)),
    Rule(tp_has_no_expert_parallel, example(topology={"strategy": "tp", "expertParallel": True}),
         cel=("tp-no-expert-parallel",)),
    Rule(tp_fits_one_node_or_whole_nodes, example(topology={"tensorParallelSize": 6}),
         cel=("tp-fits-node-or-whole-nodes",)),
    Rule(data_parallel_size_required, example(topology={"strategy": "tp-dp", "tensorParallelSize": 4}),
         cel=("data-parallel-required",)),
    Rule(pipeline_parallel_with_tp_only,
         example(topology={"strategy": "dep", "dataParallelSize": 16, "pipelineParallelSize": 2}),
         cel=("pipeline-parallel-tp-only",)),
    Rule(dep_runs_tp_one, example(topology={"strategy": "dep", "dataParallelSize": 16, "tensorParallelSize": 8}),
         cel=("dep-tp-one",)),
    Rule(dep_fills_whole_nodes, example(topology={"strategy": "dep", "dataParallelSize": 10}),
         cel=("dep-whole-nodes",)),
    Rule(tp_dp_keeps_tp_inside_a_node,
         example(topology={"strategy": "tp-dp", "tensorParallelSize": 8, "dataParallelSize": 2,
                           "expertParallel": True}),
         cel=("tp-dp-tp-divides-node",)),
    Rule(tp_dp_fills_whole_nodes,
         example(topology={"strategy": "tp-dp", "tensorParallelSize": 1, "dataParallelSize": 10,
                           "expertParallel": True}),
         cel=("tp-dp-whole-nodes",)),
    Rule(group_within_one_rack, example(topology={"tensorParallelSize": 40, "pipelineParallelSize": 2}),
         cel=("group-within-rack",)),
))
