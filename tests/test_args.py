"""Per-rank vLLM arguments (``kimik3.engine.args.rank_args``) and the engine environment.

Launch lines follow kimi-k3-and-vllm.md ("Multi-node launch (no Ray)"); failure cases F2 (every
rank gets the leader as DP address and start rank = worker index x local DP size) and F7 (one
snake_case JSON ``--speculative-config``).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from kimik3.admission import Admitted, admit
from kimik3.engine.args import LEADER_ADDRESS, engine_env, rank_args

PVC = {"source": {"pvc": {"claimName": "kimi-k3-weights"}}}
LEADER = "${LWS_LEADER_ADDRESS}"
DSPARK7 = {"method": "dspark", "draftModel": "/models/Kimi-K3-DSpark", "numSpeculativeTokens": 7,
           "draftSampleMethod": "probabilistic", "rejectionSampleMethod": "block"}


def admitted_of(topology: dict | None = None, **spec_fields: Any) -> Admitted:
    spec = {"model": dict(PVC), **spec_fields}
    if topology is not None:
        spec["topology"] = topology
    return admit(spec)


def plan_of(topology: dict | None = None, **spec_fields: Any):
    admitted = admitted_of(topology, **spec_fields)
    return admitted.spec, admitted.plan


def env_of(admitted: Admitted) -> dict[str, str]:
    """The engine environment of an admitted spec (its load timeout in seconds from admission)."""
    return engine_env(admitted.spec, admitted.plan, admitted.seconds.load_timeout)


def flags(args: list[str]) -> dict[str, Any]:
    """``[model, --a, 1, --b, ...]`` -> ``{"<model>": model, "--a": "1", "--b": True}``.

    A flag followed by a non-flag takes it as value; a bare flag is True. Fails on a repeated flag
    (vLLM would take the last one silently)."""
    out: dict[str, Any] = {"<model>": args[0]}
    i = 1
    while i < len(args):
        flag = args[i]
        assert flag.startswith("-"), f"stray value {flag!r} at {i} in {args}"
        assert flag not in out, f"{flag} given twice in {args}"
        if i + 1 < len(args) and not args[i + 1].startswith("--"):
            out[flag], i = args[i + 1], i + 2
        else:
            out[flag], i = True, i + 1
    return out


def all_rank_flags(spec, plan) -> list[dict[str, Any]]:
    return [flags(rank_args(spec, plan, r)) for r in range(plan.nodes_per_group)]


def test_placeholder_is_the_lws_leader_variable():
    assert LEADER_ADDRESS == LEADER


# ---------------------------------------------------------------- tp across trays ------------

def test_tp8_over_two_trays():
    spec, plan = plan_of({"accelerator": "gb300", "tensorParallelSize": 8})
    leader, worker = all_rank_flags(spec, plan)
    for rank, f in enumerate((leader, worker)):
        assert f["--tensor-parallel-size"] == "8"
        assert f["--nnodes"] == "2"
        assert f["--node-rank"] == str(rank)
        assert f["--master-addr"] == LEADER
        assert f["--master-port"] == "29501"
        assert "--data-parallel-size" not in f and "--enable-expert-parallel" not in f
    assert "--headless" not in leader
    assert worker["--headless"] is True
    # Apart from the rank and --headless the two command lines are the same.
    assert {k: v for k, v in leader.items() if k != "--node-rank"} == \
        {k: v for k, v in worker.items() if k not in ("--node-rank", "--headless")}


def test_tp4_pp2_over_two_trays_passes_pipeline_size():
    spec, plan = plan_of({"tensorParallelSize": 4, "pipelineParallelSize": 2})
    for rank, f in enumerate(all_rank_flags(spec, plan)):
        assert (f["--tensor-parallel-size"], f["--pipeline-parallel-size"], f["--nnodes"], f["--node-rank"]) == \
            ("4", "2", "2", str(rank))


def test_single_node_tp8_has_no_multi_node_flags():
    spec, plan = plan_of({"accelerator": "b300", "tensorParallelSize": 8})
    f = flags(rank_args(spec, plan, 0))
    assert f["--tensor-parallel-size"] == "8"
    for absent in ("--nnodes", "--node-rank", "--master-addr", "--master-port", "--headless",
                   "--data-parallel-address"):
        assert absent not in f
    with pytest.raises(ValueError):
        rank_args(spec, plan, 1)


def test_common_args_of_the_latency_recipe():
    spec, plan = plan_of({"tensorParallelSize": 8}, engine={
        "decodeBackend": "latency_specialized", "moeBackend": "flashinfer_trtllm", "maxNumSeqs": 64,
        "loadFormat": "fastsafetensors", "cudagraphMode": "FULL_AND_PIECEWISE"}, speculativeDecoding=DSPARK7)
    f = flags(rank_args(spec, plan, 0))
    assert f["<model>"] == "/models"
    assert f["--served-model-name"] == "kimi-k3"
    assert f["--trust-remote-code"] is True
    assert f["--port"] == "8000"
    assert f["--kv-cache-dtype"] == "fp8"
    assert f["--gpu-memory-utilization"] == "0.9"
    assert f["--max-num-seqs"] == "64"
    assert f["--max-num-batched-tokens"] == "8192"
    assert f["--moe-backend"] == "flashinfer_trtllm"
    assert f["--load-format"] == "fastsafetensors"
    assert json.loads(f["--compilation-config"]) == {"cudagraph_mode": "FULL_AND_PIECEWISE"}
    assert f["--tool-call-parser"] == "kimi_k3" and f["--enable-auto-tool-choice"] is True
    assert f["--reasoning-parser"] == "kimi_k3"
    assert f["--enable-prefix-caching"] is True and f["--language-model-only"] is True
    assert "--enforce-eager" not in f


# ---------------------------------------------------------------- data / expert parallel ----

def test_dep16_over_four_trays():
    spec, plan = plan_of({"accelerator": "gb300", "strategy": "dep", "dataParallelSize": 16})
    ranks = all_rank_flags(spec, plan)
    assert len(ranks) == 4
    for rank, f in enumerate(ranks):
        assert f["--data-parallel-address"] == LEADER  # F2: never the 127.0.0.1 default
        assert f.get("--data-parallel-start-rank", "0") == str(rank * 4)  # leader: implied 0 (tests/conformance)
        assert f["--data-parallel-size"] == "16"
        assert f["--data-parallel-size-local"] == "4"
        assert f["--tensor-parallel-size"] == "1"
        assert f["--enable-expert-parallel"] is True
        assert f["--all2all-backend"] == "flashinfer_nvlink_one_sided"
        assert f["--data-parallel-rpc-port"] == "13345"
        assert ("--headless" in f) is (rank > 0)
        assert "--nnodes" not in f and "--master-addr" not in f


@pytest.mark.parametrize("topology", [
    pytest.param({"strategy": "dep", "dataParallelSize": 8}, id="dep8"),
    pytest.param({"strategy": "tp-dp", "tensorParallelSize": 1, "dataParallelSize": 8, "expertParallel": True},
                 id="tp-dp-tp1-dp8-ep"),
])
def test_dp8_over_two_trays_of_four_gpus(topology):
    """F2: DP=8 with expert parallel over 2 nodes: both ranks get the leader address, start ranks 0 and 4."""
    spec, plan = plan_of(topology)
    ranks = all_rank_flags(spec, plan)
    assert [f.get("--data-parallel-start-rank", "0") for f in ranks] == ["0", "4"]
    assert "--data-parallel-start-rank" not in ranks[0]  # vLLM 0.33 would read it as hybrid LB (tests/conformance)
    assert [f["--data-parallel-address"] for f in ranks] == [LEADER, LEADER]
    assert [f["--data-parallel-size-local"] for f in ranks] == ["4", "4"]
    assert all(f["--data-parallel-size"] == "8" and f["--enable-expert-parallel"] is True for f in ranks)


def test_tp4_dp4_expert_parallel_one_dp_rank_per_tray():
    spec, plan = plan_of({"strategy": "tp-dp", "tensorParallelSize": 4, "dataParallelSize": 4, "expertParallel": True})
    ranks = all_rank_flags(spec, plan)
    assert [f.get("--data-parallel-start-rank", "0") for f in ranks] == ["0", "1", "2", "3"]
    assert all((f["--tensor-parallel-size"], f["--data-parallel-size"], f["--data-parallel-size-local"]) ==
               ("4", "4", "1") for f in ranks)


@pytest.mark.parametrize("accelerator,engine,backend", [
    ("h200", {}, "deepep_v2"),  # RDMA between HGX nodes
    ("gb300", {"all2allBackend": "deepep_low_latency"}, "deepep_low_latency"),  # explicit wins
    ("gb300", {"moeBackend": "deep_gemm_mega_moe"}, None),  # dispatches on its own
])
def test_all2all_backend(accelerator, engine, backend):
    spec, plan = plan_of({"accelerator": accelerator, "strategy": "dep", "dataParallelSize": 16}, engine=engine)
    for f in all_rank_flags(spec, plan):
        assert f.get("--all2all-backend") == backend


# ---------------------------------------------------------------- speculative decoding (F7) --

@pytest.mark.parametrize("sd,expected", [
    pytest.param({"method": "ngram", "numSpeculativeTokens": 10, "promptLookupMax": 10},
                 {"method": "ngram", "num_speculative_tokens": 10, "prompt_lookup_max": 10}, id="ngram"),
    pytest.param({"method": "ngram", "numSpeculativeTokens": 4, "promptLookupMin": 2, "promptLookupMax": 5},
                 {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 5},
                 id="ngram-min-max"),
    pytest.param({"method": "mtp", "numSpeculativeTokens": 1}, {"method": "mtp", "num_speculative_tokens": 1},
                 id="mtp"),
    pytest.param({"method": "eagle3", "draftModel": "/models/Kimi-K3-eagle3", "numSpeculativeTokens": 3},
                 {"method": "eagle3", "model": "/models/Kimi-K3-eagle3", "num_speculative_tokens": 3}, id="eagle3"),
    pytest.param(DSPARK7, {"method": "dspark", "model": "/models/Kimi-K3-DSpark", "num_speculative_tokens": 7,
                           "draft_sample_method": "probabilistic", "rejection_sample_method": "block"}, id="dspark"),
    pytest.param({**DSPARK7, "adaptiveVerification": True, "draftTensorParallelSize": 1},
                 {"method": "dspark", "model": "/models/Kimi-K3-DSpark", "num_speculative_tokens": 7,
                  "draft_sample_method": "probabilistic", "rejection_sample_method": "block",
                  "enable_adaptive_verification": True, "draft_tensor_parallel_size": 1}, id="dspark-adaptive"),
])
def test_speculative_config_is_one_snake_case_json_argument(sd, expected):
    spec, plan = plan_of({"tensorParallelSize": 8}, speculativeDecoding=sd)
    for rank in range(plan.nodes_per_group):
        args = rank_args(spec, plan, rank)
        assert args.count("--speculative-config") == 1
        value = args[args.index("--speculative-config") + 1]
        assert json.loads(value) == expected
        assert " " not in value  # one argv element, compact: nothing for a shell to split


def test_no_speculative_config_without_speculation():
    spec, plan = plan_of({"tensorParallelSize": 8}, speculativeDecoding={"method": "none"})
    assert all("--speculative-config" not in f for f in all_rank_flags(spec, plan))


# ---------------------------------------------------------------- decode path ---------------

def test_megakernel_sets_additional_config_on_every_rank():
    spec, plan = plan_of({"tensorParallelSize": 16}, engine={"decodeBackend": "latency_specialized"},
                         speculativeDecoding=DSPARK7)
    for f in all_rank_flags(spec, plan):
        assert json.loads(f["--additional-config"]) == {"decode_backend": "latency_specialized"}
        assert "--enforce-eager" not in f and "--enable-expert-parallel" not in f


def test_stock_decode_path_sets_no_additional_config():
    spec, plan = plan_of({"tensorParallelSize": 8}, engine={"decodeBackend": "stock"})
    assert all("--additional-config" not in f for f in all_rank_flags(spec, plan))


def test_extra_args_come_last_and_verbatim():
    spec, plan = plan_of({"tensorParallelSize": 8}, engine={"extraArgs": ["--max-log-len=100", "--disable-log-stats"]})
    for rank in range(plan.nodes_per_group):
        assert rank_args(spec, plan, rank)[-2:] == ["--max-log-len=100", "--disable-log-stats"]


# ---------------------------------------------------------------- environment ---------------

GB300_MNNVL = {"NCCL_MNNVL_ENABLE": "1", "NCCL_CUMEM_ENABLE": "1", "VLLM_ALLREDUCE_USE_FLASHINFER": "1",
               "VLLM_FLASHINFER_ALLREDUCE_BACKEND": "mnnvl", "VLLM_USE_NCCL_SYMM_MEM": "0"}


def test_gb300_multi_node_env():
    env = env_of(admitted_of({"tensorParallelSize": 8}))
    assert env.items() >= GB300_MNNVL.items()
    assert env["VLLM_USE_V2_MODEL_RUNNER"] == "1"


def test_hgx_nodes_get_no_multi_node_nvlink_env():
    env = env_of(admitted_of({"accelerator": "h200", "tensorParallelSize": 16}))
    assert not set(GB300_MNNVL) & set(env)


@pytest.mark.parametrize("load_timeout,seconds", [("90m", "5400"), ("60m", "3600"), ("1h30m", "5400"),
                                                  ("2h", "7200")])
def test_engine_ready_timeout_is_the_load_timeout(load_timeout, seconds):
    env = env_of(admitted_of({"tensorParallelSize": 8}, probes={"loadTimeout": load_timeout}))
    assert env["VLLM_ENGINE_READY_TIMEOUT_S"] == seconds


@pytest.mark.parametrize("source,offline", [
    ({"pvc": {"claimName": "w"}}, True),
    ({"hostPath": {"path": "/data/kimi-k3"}}, True),
    ({"hub": {}}, False),
])
def test_hub_offline_when_weights_are_pre_staged(source, offline):
    env = env_of(admit({"model": {"source": source}}))
    assert (env.get("HF_HUB_OFFLINE") == "1") is offline
    assert ("HF_HUB_OFFLINE" in env) is offline


def test_user_env_overrides_operator_env():
    env = env_of(admitted_of({"tensorParallelSize": 8}, engine={"env": [
        {"name": "NCCL_MNNVL_ENABLE", "value": "0"}, {"name": "NCCL_SOCKET_IFNAME", "value": "eth0"}]}))
    assert env["NCCL_MNNVL_ENABLE"] == "0"
    assert env["NCCL_SOCKET_IFNAME"] == "eth0"
    assert env["NCCL_CUMEM_ENABLE"] == "1"
