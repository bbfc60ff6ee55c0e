"""Argument conformance: every rank's command line, parsed by vLLM's own parser, means the spec.

For every recipe and ~400 generated admitted specs (every strategy, accelerator profile,
speculative method, decode backend, MoE/all-to-all backend, KV-cache dtype, extraArgs and env
that touch the megakernel path), each rank's ``rank_args`` (leader placeholder replaced by an
address, as the launcher does) goes through vLLM 0.33.0's ``make_arg_parser(FlexibleArgumentParser())``
and ``AsyncEngineArgs.from_cli_args`` in one helper process (operator/kimik3_dev/doctor/vllm_parse.py), and
the parsed values must equal what the spec asked for. vLLM's GPU-free config checks
(CacheConfig, ObservabilityConfig, SpeculativeConfig fields / ngram / draft TP, and the megakernel's
own ``unsupported`` list) must pass for every spec admission accepts (failure case F7): what vLLM
rejects, admission refuses with the field path (tests below).
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest

from conformance_cases import (ADDRESS, PVC, Case, defaults_of, generated_cases, make_case, problems, recipe_cases,
                               stated_layout_cases, stated_problems)
from kimik3.admission import admit
from kimik3.api.errors import SpecErrors
from kimik3.api.v1alpha1 import KimiK3DeploymentSpec
from kimik3.engine import args as args_mod
from kimik3_dev import doctor

pytestmark = pytest.mark.timeout(900)  # one vLLM import: 7 s idle, minutes on a busy 2-core machine
DSPARK7 = {"method": "dspark", "draftModel": "Inferact/Kimi-K3-DSpark", "numSpeculativeTokens": 7}


PARALLEL_FLAGS = {"--tensor-parallel-size", "--pipeline-parallel-size", "--data-parallel-size",
                  "--data-parallel-size-local", "--data-parallel-address", "--data-parallel-rpc-port",
                  "--data-parallel-start-rank", "--nnodes", "--node-rank", "--master-addr", "--master-port"}


def parallel_only(argv: list[str]) -> list[str]:
    out = []
    for i, a in enumerate(argv):
        if a in PARALLEL_FLAGS:
            out += [a, argv[i + 1]]
        elif a in ("--enable-expert-parallel", "--headless"):
            out.append(a)
    return out


def run(venv: doctor.VllmVenv, cases: list[Case], with_checks: bool = True,
        launch_cases: list[Case] = ()) -> tuple[str, dict, dict]:
    """Parse every rank of every case (rank 0 also through vLLM's config checks) in one process;
    for ``launch_cases`` also run vLLM's create_engine_config on each rank's parallel flags.
    Returns the vLLM version, vLLM's defaults, and {case name: [result per rank]} (launch results
    under "<name>#launch")."""
    requests: list[dict[str, Any]] = [{"argv": ["/models"]}]
    index = []
    for case in cases:
        for rank, argv in enumerate(case.argvs):
            if rank == 0 and with_checks:
                requests.append({"checks": {"argv": argv, "env": case.env, "sm100_family": case.sm100_family}})
            else:
                requests.append({"argv": argv})
            index.append(case.name)
    for case in launch_cases:
        for rank, argv in enumerate(case.argvs):
            requests.append({"engine_config": {"argv": parallel_only(argv), "headless": "--headless" in argv}})
            index.append(case.name + "#launch")
    version, results = doctor.run_helper(venv, requests)
    by_case: dict[str, list] = {}
    for name, res in zip(index, results[1:]):
        by_case.setdefault(name, []).append(res)
    return version, defaults_of(results[0]), by_case


@pytest.fixture(scope="module")
def recipes() -> list[Case]:
    return recipe_cases()


@pytest.fixture(scope="module")
def generated() -> list[Case]:
    cases, _ = generated_cases()
    return cases


@pytest.fixture(scope="module")
def parsed(parser_venv, recipes, generated):
    """One helper process for every case of this module (importing vLLM costs 7-90 s on a busy
    2-core machine): recipes, the stated layouts, the generated set, F7, the admission-rule cases, the
    sabotaged builders."""
    return run(parser_venv, recipes + stated_layout_cases() + generated + [f7_case()] + rule_cases()
               + sabotaged_cases(), launch_cases=launch_cases(recipes, generated))


def launch_cases(recipes: list[Case], generated: list[Case]) -> list[Case]:
    """Multi-node data-parallel groups: the recipes', the stated layouts', and up to 32 generated."""
    dp = [c for c in recipes + stated_layout_cases() + generated if c.plan.multi_node and c.plan.strategy != "tp"]
    return dp[:34]


def test_parsed_with_the_pinned_vllm(parser_venv, parsed):
    version = parsed[0]
    assert version == parser_venv.version
    if version != args_mod.VLLM_VERSION:  # tools/vllm-envs.sh could not build the pinned venv: say so
        pytest.skip(f"FALLBACK: parsed with vLLM {version}, not the pinned {args_mod.VLLM_VERSION} "
                    f"(see {doctor.PARSER_VENVS[args_mod.VLLM_VERSION]}.log); 0.33-only checks are skipped")


def test_every_recipe_rank_parses_to_what_the_recipe_asks(recipes, parsed):
    version, defaults, by_case = parsed
    assert len(recipes) >= 2
    found = [p for case in recipes for p in problems(case, by_case[case.name], defaults, version)]
    assert not found, "\n".join(found)


def test_stated_layouts_parse_rank_by_rank(parsed):
    """Whole groups written out as values (conformance_cases.STATED_LAYOUTS), and the generic
    checks on them too."""
    version, defaults, by_case = parsed
    cases = stated_layout_cases()
    assert len(cases) >= 8 and {c.plan.strategy for c in cases} == {"tp", "dep", "tp-dp"}
    found = [p for case in cases for p in stated_problems(case, by_case[case.name], defaults, version)
             + problems(case, by_case[case.name], defaults, version)]
    assert not found, "\n".join(found)


def test_latency_recipe_rank1_parsed_values(recipes, parsed):
    """The seed's configuration, value by value, as vLLM 0.33.0 holds it for the worker."""
    version, _, by_case = parsed
    case = next(c for c in recipes if c.name.endswith(":k3-latency"))
    res = by_case[case.name][1]
    assert res["ok"], res
    e, a = res["engine"], res["args"]
    assert (e["tensor_parallel_size"], e["nnodes"], e["node_rank"], e["master_addr"], e["master_port"]) == (
        8, 2, 1, ADDRESS, 29501)
    assert a["headless"] is True
    assert e["additional_config"] == {"decode_backend": "latency_specialized"}
    assert e["speculative_config"] == {"method": "dspark", "model": "/models/Inferact/Kimi-K3-DSpark/main",
                                       "num_speculative_tokens": 7, "draft_sample_method": "probabilistic",
                                       "rejection_sample_method": "block"}
    assert e["compilation_config"]["cudagraph_mode"] == "FULL_AND_PIECEWISE"
    assert (e["kv_cache_dtype"], e["gpu_memory_utilization"], e["max_num_seqs"]) == ("fp8", 0.9, 64)
    assert e["served_model_name"] == ["kimi-k3"] and e["model"] == "/models/moonshotai/Kimi-K3/main"
    assert by_case[case.name][0]["problems"] == [], "vLLM's specialised-decode checks refuse the latency recipe"


def test_throughput_recipe_dep16_ranks(recipes, parsed):
    version, _, by_case = parsed
    case = next(c for c in recipes if c.name.endswith(":k3-throughput"))
    results = by_case[case.name]
    assert len(results) == 4
    for rank, res in enumerate(results):
        e, a = res["engine"], res["args"]
        assert (e["data_parallel_size"], e["data_parallel_size_local"], e["data_parallel_start_rank"]) == (
            16, 4, 4 * rank if rank else None)  # the leader's 0 is implied (see test_dp_launch_modes)
        assert (e["data_parallel_address"], e["data_parallel_rpc_port"]) == (ADDRESS, 13345)
        assert e["enable_expert_parallel"] is True and e["all2all_backend"] == "flashinfer_nvlink_one_sided"
        assert e["tensor_parallel_size"] == 1 and a["headless"] is (rank > 0)


def test_generated_set_covers_every_choice(generated):
    seen: dict[str, Counter] = {k: Counter() for k in ("accelerator", "strategy", "method", "decode", "moe",
                                                        "all2all", "kv", "nodes>1", "pp>1", "ep")}
    for c in generated:
        s = c.spec
        seen["accelerator"][s.topology.accelerator] += 1
        seen["strategy"][s.topology.strategy] += 1
        seen["method"][s.speculative_decoding.method] += 1
        seen["decode"][s.engine.decode_backend] += 1
        seen["moe"][s.engine.moe_backend] += 1
        seen["all2all"][s.engine.all2all_backend] += 1
        seen["kv"][s.engine.kv_cache_dtype] += 1
        seen["nodes>1"][c.plan.multi_node] += 1
        seen["pp>1"][c.plan.pipeline_parallel_size > 1] += 1
        seen["ep"][c.plan.expert_parallel] += 1
    assert set(seen["accelerator"]) == {"gb300", "gb200", "b300", "b200", "h200"}
    assert set(seen["strategy"]) == {"tp", "dep", "tp-dp"}
    assert set(seen["method"]) == {"dspark", "eagle3", "mtp", "ngram", "none"}
    assert set(seen["decode"]) == {"latency_specialized", "stock"}
    assert set(seen["moe"]) >= {None, "auto", "flashinfer_trtllm", "deep_gemm_mega_moe", "flashinfer_cutlass", "triton"}
    assert len(seen["all2all"]) >= 6
    assert set(seen["kv"]) == {"auto", "fp8", "fp8_e4m3", "fp8_e5m2", "bfloat16"}
    assert set(seen["nodes>1"]) == {True, False} and set(seen["pp>1"]) == {True, False} and set(seen["ep"]) == {True, False}
    assert sum(len(c.argvs) for c in generated) > len(generated)


def test_every_generated_rank_parses_to_what_the_spec_asks(generated, parsed):
    """The broad set; every difference is listed with its case, rank and flag."""
    version, defaults, by_case = parsed
    found = [p for case in generated for p in problems(case, by_case[case.name], defaults, version)]
    assert not found, f"{len(found)} problem(s):\n" + "\n".join(found[:60])


def test_dp_launch_modes(parsed, recipes, generated):
    """vLLM's own create_engine_config on every rank of multi-node data-parallel groups: one
    group = one internal load balancer on the leader's API server over all DP engines (workers are
    headless), each rank at data_parallel_rank = worker index x local DP size. An explicit
    --data-parallel-start-rank on the leader used to switch it to hybrid (or, with one DP rank per
    node, external) load balancing, leaving the workers' engines without requests."""
    version, _, by_case = parsed
    cases = launch_cases(recipes, generated)
    assert len(cases) >= 10 and any(c.plan.data_parallel_size_local == 1 for c in cases)
    found = []
    for case in cases:
        dpl = case.plan.data_parallel_size_local
        for rank, res in enumerate(by_case[case.name + "#launch"]):
            if not res["ok"]:
                found.append(f"{case.name} rank {rank}: vLLM {version} create_engine_config: {res['error']}")
                continue
            p = res["parallel"]
            want = {"data_parallel_rank": rank * dpl, "data_parallel_size_local": dpl,
                    "data_parallel_size": case.plan.data_parallel_size, "data_parallel_hybrid_lb": False,
                    "data_parallel_external_lb": False, "data_parallel_master_ip": ADDRESS,
                    "data_parallel_rpc_port": 13345}
            for key, value in want.items():
                if p[key] != value:
                    found.append(f"{case.name} rank {rank}: vLLM {version} settles {key}={p[key]!r}, the group needs {value!r}")
    assert not found, "\n".join(found[:40])


# ---------------------------------------------------------------- F7 --------------------------

def f7_case() -> Case:
    return make_case("f7-ngram", {"model": {"source": PVC}, "topology": {"accelerator": "b300", "tensorParallelSize": 8},
                                  "speculativeDecoding": {"method": "ngram", "numSpeculativeTokens": 10,
                                                          "promptLookupMax": 10}})


def test_f7_ngram_ten_tokens_is_one_snake_case_json_vllm_accepts(parsed):
    case = f7_case()
    sc = [a for i, a in enumerate(case.argvs[0]) if i and case.argvs[0][i - 1] == "--speculative-config"]
    assert len(sc) == 1 and json.loads(sc[0]) == {"method": "ngram", "num_speculative_tokens": 10, "prompt_lookup_max": 10}
    version, defaults, by_case = parsed
    res = by_case["f7-ngram"][0]
    assert res["ok"] and res["problems"] == [], res
    assert res["engine"]["speculative_config"] == {"method": "ngram", "num_speculative_tokens": 10, "prompt_lookup_max": 10}


@pytest.mark.parametrize("spec, path", [
    ({"speculativeDecoding": DSPARK7, "topology": {"tensorParallelSize": 8, "pipelineParallelSize": 2}},
     "spec.speculativeDecoding.method"),
])
def test_f7_dspark_with_pipeline_parallelism_refused_at_admission(spec, path):
    with pytest.raises(SpecErrors) as exc:
        admit({"model": {"source": PVC}, **spec})
    assert path in [e.path for e in exc.value.errors]


# Each: a spec our admission used to accept, the field path it is now refused at, and the
# check of vLLM 0.33.0 that rejects the same arguments.
MEGAKERNEL = {"decodeBackend": "latency_specialized"}
REFUSED = [
    ("batched-below-seqs", {"engine": {"maxNumSeqs": 1024, "maxNumBatchedTokens": 512}},
     "spec.engine.maxNumBatchedTokens", "must be greater than or equal to max_num_seqs"),
    ("cudagraph-piecewise", {"engine": {**MEGAKERNEL, "cudagraphMode": "PIECEWISE"}},
     "spec.engine.cudagraphMode", "FULL decode CUDA graphs"),
    ("v1-model-runner", {"engine": {**MEGAKERNEL, "env": [{"name": "VLLM_USE_V2_MODEL_RUNNER", "value": "0"}]}},
     "spec.engine.env[0]", "the V1 model runner"),
    ("aux-stream", {"engine": {**MEGAKERNEL, "env": [{"name": "VLLM_KIMI_K3_AUX_ATTN_RES_STREAM", "value": "1"}]},
                    "speculativeDecoding": DSPARK7}, "spec.engine.env[0]", "AttnRes aux stream"),
    ("lora", {"engine": {**MEGAKERNEL, "extraArgs": ["--enable-lora"]}}, "spec.engine.extraArgs[0]", "LoRA"),
    ("sleep", {"engine": {**MEGAKERNEL, "extraArgs": ["--enable-sleep-mode"]}}, "spec.engine.extraArgs[0]", "sleep mode"),
    ("dbo", {"engine": {**MEGAKERNEL, "extraArgs": ["--enable-dbo"]}}, "spec.engine.extraArgs[0]", "DBO"),
    ("dcp", {"engine": {**MEGAKERNEL, "extraArgs": ["--decode-context-parallel-size", "2"]}},
     "spec.engine.extraArgs[0]", "decode context parallel"),
    ("mamba-conv", {"engine": {**MEGAKERNEL, "extraArgs": ["--mamba-cache-dtype", "float32"]}},
     "spec.engine.extraArgs[0]", "KDA cache dtypes"),
    ("mamba-ssm", {"engine": {**MEGAKERNEL, "extraArgs": ["--mamba-ssm-cache-dtype=bfloat16"]}},
     "spec.engine.extraArgs[0]", "KDA cache dtypes"),
    ("replayssm", {"engine": {**MEGAKERNEL, "extraArgs": ["--use-replayssm"]}}, "spec.engine.extraArgs[0]", "ReplaySSM"),
    ("O1", {"engine": {**MEGAKERNEL, "extraArgs": ["-O1"]}}, "spec.engine.extraArgs[0]", "FULL decode CUDA graphs"),
    ("O0-spaced", {"engine": {**MEGAKERNEL, "extraArgs": ["-O", "0"]}}, "spec.engine.extraArgs[0]", "FULL decode CUDA graphs"),
]
ACCEPTED = [  # neighbours of the refused ones that vLLM accepts: the rules are not broader than vLLM's
    ("cudagraph-full-decode-only", {"engine": {**MEGAKERNEL, "cudagraphMode": "FULL_DECODE_ONLY"}}),
    ("v2-runner-explicit", {"engine": {**MEGAKERNEL, "env": [{"name": "VLLM_USE_V2_MODEL_RUNNER", "value": "1"}]}}),
    ("aux-stream-no-speculation", {"engine": {**MEGAKERNEL, "env": [{"name": "VLLM_KIMI_K3_AUX_ATTN_RES_STREAM", "value": "1"}]}}),
    ("dcp-equal-tp", {"engine": {**MEGAKERNEL, "extraArgs": ["--decode-context-parallel-size", "8"]}}),
    ("mamba-bf16", {"engine": {**MEGAKERNEL, "extraArgs": ["--mamba-cache-dtype", "bfloat16"]}}),
    ("O3", {"engine": {**MEGAKERNEL, "extraArgs": ["-O3"]}}),
    ("O1-with-full-graphs", {"engine": {**MEGAKERNEL, "cudagraphMode": "FULL_AND_PIECEWISE", "extraArgs": ["-O1"]}}),
    ("lora-stock", {"engine": {"decodeBackend": "stock", "extraArgs": ["--enable-lora"]}}),
]


def _gb300_tp8(extra: dict[str, Any]) -> dict[str, Any]:
    spec = {"model": {"source": PVC}, "topology": {"accelerator": "gb300", "tensorParallelSize": 8}}
    for key, value in extra.items():
        spec[key] = value
    return spec


def _bypassing_admission(name: str, raw: dict[str, Any]) -> Case:
    """The arguments the builders would emit for ``raw`` had admission let it through (the plan of
    the same shape without the refused setting)."""
    spec = KimiK3DeploymentSpec.model_validate(raw)
    plan = admit(_gb300_tp8({})).plan
    return Case(name, raw, spec, plan)


def rule_cases() -> list[Case]:
    cases = [_bypassing_admission(n, _gb300_tp8(x)) for n, x, *_ in REFUSED]
    return cases + [make_case(n, _gb300_tp8(x)) for n, x in ACCEPTED]


@pytest.fixture(scope="module")
def rule_verdicts(parsed):
    version, _, by_case = parsed
    return version, by_case


@pytest.mark.parametrize("name, extra, path, vllm_reason", REFUSED, ids=[r[0] for r in REFUSED])
def test_admission_refuses_what_vllm_refuses(name, extra, path, vllm_reason, rule_verdicts):
    version, by_case = rule_verdicts
    res = by_case[name][0]
    if res.get("unavailable"):
        pytest.skip(f"vLLM {version} cannot judge it: {res['unavailable']}")
    assert res["ok"], res  # the parser takes it ...
    assert any(vllm_reason in p["error"] for p in res["problems"]), (  # ... vLLM's own checks refuse it
        f"vLLM {version} no longer refuses {name}: {res['problems']}; drop the admission rule")
    with pytest.raises(SpecErrors) as exc:  # ... and so does admission, at the field path
        admit(_gb300_tp8(extra))
    assert path in [e.path for e in exc.value.errors], exc.value.errors


@pytest.mark.parametrize("name, extra", ACCEPTED, ids=[a[0] for a in ACCEPTED])
def test_admission_accepts_what_vllm_accepts(name, extra, rule_verdicts):
    version, by_case = rule_verdicts
    res = by_case[name][0]
    assert res["ok"] and res["problems"] == [], f"vLLM {version}: {res}"


# ---------------------------------------------------------------- the decisive check ------------

DEP16 = {"model": {"source": PVC}, "topology": {"strategy": "dep", "dataParallelSize": 16}}


def sabotaged_cases() -> list[Case]:
    """The DEP16 spec with its builders broken three ways (a misspelled flag, a wrong value vLLM
    parses, a value vLLM's config refuses), and once unbroken."""
    real_parallel, real_common = args_mod.parallel_args, args_mod.common_args

    def misspelled(spec, plan, rank):
        return ["--tensor-parallel-sizes" if a == "--tensor-parallel-size" else a for a in real_parallel(spec, plan, rank)]

    def off_by_one(spec, plan, rank):
        out = real_parallel(spec, plan, rank)
        if "--data-parallel-start-rank" in out:
            i = out.index("--data-parallel-start-rank") + 1
            out[i] = str(int(out[i]) + 1)
        return out

    def bad_dtype(spec):
        out = real_common(spec)
        out[out.index("--kv-cache-dtype") + 1] = "fp9"
        return out

    cases = []
    for name, target, fake in (("misspelled", "parallel_args", misspelled), ("off-by-one", "parallel_args", off_by_one),
                               ("bad-dtype", "common_args", bad_dtype)):
        with pytest.MonkeyPatch.context() as m:
            m.setattr(args_mod, target, fake)
            cases.append(make_case(name, DEP16))
    return cases + [make_case("clean", DEP16)]


def test_a_wrong_flag_or_value_in_a_builder_fails_naming_the_flag(parsed):
    """Sabotaged builders: the conformance check names each flag; unbroken, the same spec is clean."""
    version, defaults, by_case = parsed
    cases = {c.name: c for c in sabotaged_cases()}
    found = {n: "\n".join(problems(c, by_case[n], defaults, version)) for n, c in cases.items()}
    assert "unrecognized arguments: --tensor-parallel-sizes" in found["misspelled"]
    assert "--data-parallel-start-rank: vLLM" in found["off-by-one"] and "the group needs 4" in found["off-by-one"]
    assert "--kv-cache-dtype: vLLM" in found["bad-dtype"] and "'fp9'" in found["bad-dtype"]
    assert "CacheConfig refuses it" in found["bad-dtype"]
    assert found["clean"] == ""
