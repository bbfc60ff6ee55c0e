"""Topology planning and admission: ``kimik3.admission.admit(spec_dict)`` on camelCase specs.

Shapes that fit return an exact GroupPlan; shapes that do not are refused with every problem at
once, each at the field path the user wrote and naming what would fit (failure cases F2, F7).
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from kimik3.admission import admit
from kimik3.api.errors import SpecErrors

PVC = {"source": {"pvc": {"claimName": "kimi-k3-weights"}}}
CLIQUE = "nvidia.com/gpu.clique"


def spec(topology: dict | None = None, engine: dict | None = None, sd: dict | None = None,
         **extra: Any) -> dict[str, Any]:
    """A camelCase spec like recipes/*.yaml (weights on a PVC)."""
    out: dict[str, Any] = {"model": dict(PVC), **extra}
    if topology is not None:
        out["topology"] = topology
    if engine is not None:
        out["engine"] = engine
    if sd is not None:
        out["speculativeDecoding"] = sd
    return out


def refusal(spec_dict: dict[str, Any]) -> list[tuple[str, str]]:
    """(path, message) of every problem admit() reports; fails the test if it admits the spec."""
    with pytest.raises(SpecErrors) as info:
        admit(spec_dict)
    return [(e.path, e.message) for e in info.value.errors]


def message_at(errors: list[tuple[str, str]], path: str) -> str:
    found = [m for p, m in errors if p == path]
    assert len(found) == 1, f"expected one problem at {path}, got {errors}"
    return found[0]


MEGAKERNEL = {"decodeBackend": "latency_specialized"}
DSPARK7 = {"method": "dspark", "draftModel": "/models/Kimi-K3-DSpark", "numSpeculativeTokens": 7,
           "draftSampleMethod": "probabilistic", "rejectionSampleMethod": "block"}


# ---------------------------------------------------------------- shapes that fit ----------

# (id, spec, strategy, tp, pp, dp, dp_local, ep, gpus_per_node, nodes, compute_domain)
FITS = [
    ("gb300-tp8", spec({"accelerator": "gb300", "strategy": "tp", "tensorParallelSize": 8}),
     "tp", 8, 1, 1, 1, False, 4, 2, True),
    ("gb300-tp8-megakernel-dspark", spec({"tensorParallelSize": 8}, MEGAKERNEL, DSPARK7),
     "tp", 8, 1, 1, 1, False, 4, 2, True),
    ("gb300-tp16", spec({"accelerator": "gb300", "tensorParallelSize": 16}),
     "tp", 16, 1, 1, 1, False, 4, 4, True),
    ("gb300-tp4-pp2", spec({"tensorParallelSize": 4, "pipelineParallelSize": 2}),
     "tp", 4, 2, 1, 1, False, 4, 2, True),
    ("gb300-dep16", spec({"accelerator": "gb300", "strategy": "dep", "dataParallelSize": 16}),
     "dep", 1, 1, 16, 4, True, 4, 4, True),
    ("gb300-dep8", spec({"strategy": "dep", "dataParallelSize": 8}),
     "dep", 1, 1, 8, 4, True, 4, 2, True),
    ("gb300-tp4-dp4-ep", spec({"strategy": "tp-dp", "tensorParallelSize": 4, "dataParallelSize": 4,
                               "expertParallel": True}),
     "tp-dp", 4, 1, 4, 1, True, 4, 4, True),
    ("gb300-tp1-dp8-ep", spec({"strategy": "tp-dp", "tensorParallelSize": 1, "dataParallelSize": 8,
                               "expertParallel": True}),
     "tp-dp", 1, 1, 8, 4, True, 4, 2, True),
    ("h200-tp16", spec({"accelerator": "h200", "tensorParallelSize": 16}),
     "tp", 16, 1, 1, 1, False, 8, 2, False),
    ("h200-dep16", spec({"accelerator": "h200", "strategy": "dep", "dataParallelSize": 16}),
     "dep", 1, 1, 16, 8, True, 8, 2, False),
    ("b300-tp8", spec({"accelerator": "b300", "tensorParallelSize": 8}),
     "tp", 8, 1, 1, 1, False, 8, 1, False),
    ("b300-dep8", spec({"accelerator": "b300", "strategy": "dep", "dataParallelSize": 8}),
     "dep", 1, 1, 8, 8, True, 8, 1, False),
    ("gb200-tp16", spec({"accelerator": "gb200", "tensorParallelSize": 16}),
     "tp", 16, 1, 1, 1, False, 4, 4, True),
    ("gb300-tp72-whole-rack", spec({"tensorParallelSize": 72}),
     "tp", 72, 1, 1, 1, False, 4, 18, True),
    # Defaults: tp is TP8; tp-dp is one node per DP rank; dep is TP=1.
    ("default-topology", spec(), "tp", 8, 1, 1, 1, False, 4, 2, True),
    ("tp-dp-default-tp", spec({"strategy": "tp-dp", "dataParallelSize": 2, "expertParallel": True,
                               "accelerator": "b300"}),
     "tp-dp", 8, 1, 2, 1, True, 8, 2, False),
]


@pytest.mark.parametrize(
    "spec_dict,strategy,tp,pp,dp,dp_local,ep,gpus_per_node,nodes,compute_domain",
    [pytest.param(*case[1:], id=case[0]) for case in FITS])
def test_plan_of_shapes_that_fit(spec_dict, strategy, tp, pp, dp, dp_local, ep, gpus_per_node, nodes,
                                 compute_domain):
    plan = admit(spec_dict).plan
    assert (plan.strategy, plan.tensor_parallel_size, plan.pipeline_parallel_size) == (strategy, tp, pp)
    assert (plan.data_parallel_size, plan.data_parallel_size_local, plan.expert_parallel) == (dp, dp_local, ep)
    assert (plan.gpus_per_node, plan.nodes_per_group) == (gpus_per_node, nodes)
    assert plan.gpus_per_group == gpus_per_node * nodes
    assert plan.multi_node is (nodes > 1)
    # A ComputeDomain and clique placement exactly for multi-tray groups on NVL72 (gb300/gb200);
    # HGX nodes (b300/h200) have no NVLink across nodes.
    assert plan.needs_compute_domain is compute_domain
    assert plan.clique_placement is compute_domain


def test_gb300_tp8_is_two_trays_of_four_gpus_in_one_clique():
    admitted = admit(spec({"accelerator": "gb300", "tensorParallelSize": 8}))
    parsed, plan = admitted.spec, admitted.plan
    assert plan.profile.name == "gb300"
    assert (plan.nodes_per_group, plan.gpus_per_node, plan.gpus_per_group) == (2, 4, 8)
    assert plan.needs_compute_domain and plan.clique_placement
    assert parsed.scheduling.topology_key == CLIQUE


def test_tp4_dp4_on_gb300_spans_16_gpus_only_with_expert_parallel():
    shape = {"strategy": "tp-dp", "tensorParallelSize": 4, "dataParallelSize": 4}
    # Without expert parallelism every DP rank holds a whole copy: 4 x 288 GB = 1152 GB < 1680 GB.
    errors = refusal(spec(shape))
    assert [p for p, _ in errors] == ["spec.topology"]
    msg = errors[0][1]
    assert "1152 GB" in msg and "1680 GB" in msg
    assert re.search(r"\b8\b", msg), msg
    # With expert parallelism the experts spread over all 16 GPUs.
    plan = admit(spec({**shape, "expertParallel": True})).plan
    assert plan.expert_parallel
    assert (plan.gpus_per_group, plan.nodes_per_group, plan.data_parallel_size_local) == (16, 4, 1)


# ---------------------------------------------------------------- refusals ----------------

# (id, spec, every path reported, the path looked at, what the message must name)
REFUSALS = [
    pytest.param(spec({"strategy": "dep", "dataParallelSize": 6}),
                 ["spec.topology.dataParallelSize"], "spec.topology.dataParallelSize", r"\b8\b",
                 id="F2-dep-dp6-on-4-gpu-trays"),
    pytest.param(spec({"strategy": "tp-dp", "tensorParallelSize": 1, "dataParallelSize": 6, "expertParallel": True}),
                 ["spec.topology.dataParallelSize"], "spec.topology.dataParallelSize", r"\b8\b",
                 id="F2-tp-dp-dp6-on-4-gpu-trays"),
    pytest.param(spec({"strategy": "tp-dp", "tensorParallelSize": 8, "dataParallelSize": 2, "expertParallel": True}),
                 ["spec.topology.tensorParallelSize"], "spec.topology.tensorParallelSize", r"1, 2, 4.*strategy tp",
                 id="tp-dp-tp8-larger-than-a-tray"),
    pytest.param(spec({"strategy": "tp", "tensorParallelSize": 6}),
                 ["spec.topology.tensorParallelSize"], "spec.topology.tensorParallelSize", r"\b8\b",
                 id="tp6-not-whole-trays"),
    pytest.param(spec({"tensorParallelSize": 4, "pipelineParallelSize": 2}, sd=DSPARK7),
                 ["spec.speculativeDecoding.method"], "spec.speculativeDecoding.method",
                 r"pipelineParallelSize to 1", id="F7-dspark-with-pp2"),
    pytest.param(spec({"strategy": "dep", "dataParallelSize": 16, "tensorParallelSize": 8}),
                 ["spec.topology.tensorParallelSize"], "spec.topology.tensorParallelSize", r"TP=1",
                 id="dep-with-tp8"),
    pytest.param(spec({"accelerator": "gb200", "tensorParallelSize": 8}),
                 ["spec.topology"], "spec.topology", r"tensorParallelSize 16", id="gb200-tp8-too-little-memory"),
    pytest.param(spec({"accelerator": "h200", "tensorParallelSize": 16}, MEGAKERNEL),
                 ["spec.engine.decodeBackend"], "spec.engine.decodeBackend", r"gb300.*stock",
                 id="megakernel-on-h200"),
    pytest.param(spec({"strategy": "dep", "dataParallelSize": 16}, MEGAKERNEL),
                 ["spec.engine.decodeBackend"], "spec.engine.decodeBackend", r"strategy tp.*8 or 16|stock",
                 id="megakernel-with-dep"),
    pytest.param(spec({"accelerator": "b300", "tensorParallelSize": 4}, MEGAKERNEL),
                 ["spec.topology", "spec.topology.tensorParallelSize"], "spec.topology.tensorParallelSize",
                 r"8 or 16", id="megakernel-with-tp4"),
    pytest.param(spec({}, MEGAKERNEL, {**DSPARK7, "draftModel": "/models/Kimi-K3-speculator.dspark",
                                       "numSpeculativeTokens": 8}),
                 ["spec.speculativeDecoding.numSpeculativeTokens"], "spec.speculativeDecoding.numSpeculativeTokens",
                 r"\b7\b", id="megakernel-with-dspark-8-tokens"),
    pytest.param(spec({}, MEGAKERNEL, {"method": "eagle3", "draftModel": "/models/eagle3", "numSpeculativeTokens": 3}),
                 ["spec.speculativeDecoding.method"], "spec.speculativeDecoding.method", r"dspark",
                 id="megakernel-with-eagle3"),
    pytest.param(spec({}, MEGAKERNEL, {**DSPARK7, "adaptiveVerification": True}),
                 ["spec.speculativeDecoding.adaptiveVerification"], "spec.speculativeDecoding.adaptiveVerification",
                 r"false|stock", id="megakernel-with-adaptive-verification"),
    pytest.param(spec({}, {**MEGAKERNEL, "enforceEager": True}),
                 ["spec.engine.enforceEager"], "spec.engine.enforceEager", r"false|stock",
                 id="megakernel-with-enforce-eager"),
    pytest.param(spec({}, {"extraArgs": ["--tensor-parallel-size=4"]}),
                 ["spec.engine.extraArgs[0]"], "spec.engine.extraArgs[0]", r"--tensor-parallel-size.*topology",
                 id="extra-args-owned-flag-with-equals"),
    pytest.param(spec({}, {"extraArgs": ["--max-log-len", "10", "--speculative-config", "{}"]}),
                 ["spec.engine.extraArgs[2]"], "spec.engine.extraArgs[2]", r"--speculative-config.*speculativeDecoding",
                 id="extra-args-owned-flag-as-separate-arg"),
    pytest.param(spec({}, {"extraArgs": ["--api_key=sk-plain"]}),
                 ["spec.engine.extraArgs[0]"], "spec.engine.extraArgs[0]", r"plain text.*spec\.service\.apiKeySecret",
                 id="api-key-in-extra-args"),
    pytest.param(spec({}, {"env": [{"name": "VLLM_API_KEY", "value": "sk-plain"}]}),
                 ["spec.engine.env[0].name"], "spec.engine.env[0].name", r"plain text.*spec\.service\.apiKeySecret",
                 id="api-key-in-env"),
]


@pytest.mark.parametrize("spec_dict,paths,path,names", REFUSALS)
def test_refusal_names_field_path_and_what_fits(spec_dict, paths, path, names):
    errors = refusal(spec_dict)
    assert sorted(p for p, _ in errors) == sorted(paths), errors
    msg = message_at(errors, path)
    assert re.search(names, msg), f"{path}: {msg!r} does not name what fits ({names})"


def test_tp_dp_tp4_dp4_without_expert_parallel_is_refused_for_memory():
    errors = refusal(spec({"strategy": "tp-dp", "tensorParallelSize": 4, "dataParallelSize": 4}))
    assert [p for p, _ in errors] == ["spec.topology"]


def _suggested(message: str) -> list[int]:
    """The values a shape refusal proposes ("use 4 or 8", "(e.g. 4 or 8)", "use 4 or 8 or 12")."""
    found = re.findall(r"(?:use|e\.g\.) (\d+(?: or \d+)*)", message)
    assert found, f"no suggestion in {message!r}"
    return [int(x) for x in found[-1].split(" or ")]


@pytest.mark.parametrize("topology,field", [
    pytest.param({"strategy": "dep", "dataParallelSize": 6}, "dataParallelSize", id="gb300-dep6"),
    pytest.param({"strategy": "tp", "tensorParallelSize": 6}, "tensorParallelSize", id="gb300-tp6"),
    pytest.param({"strategy": "tp-dp", "tensorParallelSize": 1, "dataParallelSize": 6, "expertParallel": True},
                 "dataParallelSize", id="gb300-tp-dp-dp6"),
    pytest.param({"accelerator": "h200", "tensorParallelSize": 12}, "tensorParallelSize", id="h200-tp12"),
    pytest.param({"accelerator": "b300", "strategy": "dep", "dataParallelSize": 6}, "dataParallelSize",
                 id="b300-dep6"),
    pytest.param({"accelerator": "b300", "tensorParallelSize": 12}, "tensorParallelSize", id="b300-tp12"),
])
def test_every_value_a_refusal_proposes_is_admitted(topology, field):
    errors = refusal(spec(topology))
    msg = message_at(errors, f"spec.topology.{field}")
    still_refused = {}
    for value in _suggested(msg):
        try:
            admit(spec({**topology, field: value}))
        except SpecErrors as exc:
            still_refused[value] = str(exc)
    assert not still_refused, f"{msg!r} proposes values admission refuses: {still_refused}"


@pytest.mark.parametrize("extra_arg", [
    "--tensor_parallel_size=4",
    "--speculative-config.num_speculative_tokens=8",
    "--speculative_config={\"method\":\"ngram\"}",
])
def test_extra_args_refuse_every_spelling_vllm_accepts_of_an_owned_flag(extra_arg):
    """vLLM's FlexibleArgumentParser reads ``_`` as ``-`` in flag names and ``--json-arg.key value``
    as one key of a JSON flag: each spelling of an owned flag must be refused."""
    errors = refusal(spec({}, {"extraArgs": ["--max-log-len=100", extra_arg]}))
    assert [p for p, _ in errors] == ["spec.engine.extraArgs[1]"]


def test_extra_args_with_flags_the_operator_does_not_own_are_admitted():
    parsed = admit(spec({}, {"extraArgs": ["--max-log-len=100", "--disable-log-requests"]})).spec
    assert parsed.engine.extra_args == ["--max-log-len=100", "--disable-log-requests"]


def test_every_problem_of_one_spec_is_reported_at_once():
    errors = refusal(spec(
        {"strategy": "dep", "dataParallelSize": 6},
        {**MEGAKERNEL, "extraArgs": ["--max-num-seqs=3"]},
        {**DSPARK7, "numSpeculativeTokens": 8},
    ))
    assert sorted(p for p, _ in errors) == sorted([
        "spec.topology.dataParallelSize",  # DP=6 on 4-GPU trays
        "spec.engine.decodeBackend",  # megakernel with dep
        "spec.speculativeDecoding.numSpeculativeTokens",  # megakernel with 8 drafts
        "spec.engine.extraArgs[0]",  # an owned flag
    ])


def test_every_schema_problem_is_reported_at_once_with_camel_case_paths():
    errors = refusal(spec({"tensorParallelSize": 0}, {"maxNumSeqs": 0, "maxNumSeq": 5}))
    assert sorted(p for p, _ in errors) == [
        "spec.engine.maxNumSeq", "spec.engine.maxNumSeqs", "spec.topology.tensorParallelSize"]
    assert "unknown field" in message_at(errors, "spec.engine.maxNumSeq")


@pytest.mark.parametrize("placement,path", [
    ({"mode": "kueue"}, "spec.scheduling.placement.queueName"),
    ({"mode": "exclusive", "queueName": "q"}, "spec.scheduling.placement.queueName"),
    ({"priorityClass": "high"}, "spec.scheduling.placement.priorityClass"),
])
def test_placement_refusals_name_the_field(placement, path):
    errors = refusal({**spec({}), "scheduling": {"placement": placement}})
    assert [p for p, _ in errors] == [path]


def test_kueue_placement_is_admitted_with_a_queue():
    admitted = admit({**spec({}), "scheduling": {"placement": {"mode": "kueue", "queueName": "tenant-a"}}})
    assert admitted.spec.scheduling.placement.queue_name == "tenant-a"
