"""What vLLM 0.33.0's own config classes settle on for rendered `vllm serve` arguments.

Runs inside the pinned vLLM venv (tools/vllm-envs.sh):
    python vllm_overrides.py < cases.json > results.jsonl
stdin: a JSON list of {"name", "argv" (a leader's arguments after `vllm serve`), "sm100": bool}.
stdout: one JSON line per case, {"name", "ok", ...} with the values vLLM ends with:
- ``all2all_backend``: ``ParallelConfig`` built from the parsed arguments;
- ``cudagraph_mode``, ``compilation_mode``, ``max_cudagraph_capture_size``: a whole ``VllmConfig``
  from ``EngineArgs.create_engine_config`` over a stand-in MoE config.json (vllm_parse.STAND_IN_MOE,
  no weights) with the case's batch limits, eager and compilation flags, and its speculative token
  count (as ``ngram``: the capture sizes read only the per-request query length 1 + tokens, and
  DSpark needs its checkpoint). The platform is told what a GPU node tells vLLM: static graphs
  supported, the SM100 family or not (``sm100``); the CPU platform's own config hook (which
  turns graphs off) is not run;
- ``max_num_active_seqs``: ``VllmConfig._set_max_num_scheduled_tokens`` on the real
  ``SchedulerConfig`` with a DSpark speculative config (anchor sampling, the drafter default);
- ``megakernel_max_tokens``: ``PREPARED_MAX`` of the megakernel's providers;
- ``prefix_caching``: the parsed flag after ``EngineArgs._set_default_chunked_prefill_and_prefix_caching_args``
  for a hybrid generative model (Kimi K3: KDA layers).
Imports only vLLM, the standard library and vllm_parse (operator/kimik3_dev/doctor).
"""

from __future__ import annotations

import json
import os
import sys
import traceback
import types
from pathlib import Path
from unittest import mock

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "1"  # the engine pods' environment (kimik3.engine.args.engine_env)
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "operator" / "kimik3_dev" / "doctor"))

import vllm_parse  # noqa: E402


def flag(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def stand_in_dir() -> str:
    import tempfile
    folder = tempfile.mkdtemp(prefix="kimik3-moe-")
    with open(os.path.join(folder, "config.json"), "w", encoding="utf-8") as fh:
        json.dump(vllm_parse.STAND_IN_MOE, fh)
    return folder


def whole_config(serve, folder: str, argv: list[str], sm100: bool, tokens: int | None) -> dict:
    """A whole VllmConfig of the stand-in model with the case's batch, eager and graph settings."""
    from vllm.platforms import current_platform
    sub = [folder, "--max-model-len", "2048", "--skip-tokenizer-init",
           "--max-num-seqs", flag(argv, "--max-num-seqs"), "--max-num-batched-tokens", flag(argv, "--max-num-batched-tokens")]
    if "--enforce-eager" in argv:
        sub.append("--enforce-eager")
    if "--compilation-config" in argv:
        sub += ["--compilation-config", flag(argv, "--compilation-config")]
    if tokens:
        sub += ["--speculative-config", json.dumps({"method": "ngram", "num_speculative_tokens": tokens})]
    result, _, engine = serve.parse_objects(sub)
    if engine is None:
        return result
    cls = type(current_platform)
    with mock.patch.object(cls, "support_static_graph_mode", classmethod(lambda c: True)), \
            mock.patch.object(cls, "is_device_capability_family", lambda *a, **k: sm100, create=True), \
            mock.patch.object(cls, "check_and_update_config", classmethod(lambda c, cfg: None)):
        cfg = engine.create_engine_config()
    c = cfg.compilation_config
    return {"cudagraph_mode": c.cudagraph_mode.name, "compilation_mode": c.mode.name,
            "max_cudagraph_capture_size": c.max_cudagraph_capture_size,
            "max_num_active_seqs": cfg.scheduler_config.max_num_active_seqs}


def dspark_active_seqs(engine, tokens: int) -> int | None:
    """VllmConfig._set_max_num_scheduled_tokens on the case's SchedulerConfig and a DSpark config."""
    from vllm.config import SchedulerConfig, SpeculativeConfig, VllmConfig
    scheduler = SchedulerConfig(max_num_batched_tokens=engine.max_num_batched_tokens, max_num_seqs=engine.max_num_seqs,
                                max_model_len=engine.max_model_len or 1048576, enable_chunked_prefill=True,
                                is_encoder_decoder=False)
    # SpeculativeConfig's own predicates on its fields; the drafter's config.json without a
    # sample_from_anchor key (anchor sampling, the default)
    spec = types.SimpleNamespace(method="dspark", num_speculative_tokens=tokens,
                                 draft_model_config=types.SimpleNamespace(hf_config=types.SimpleNamespace()))
    for name in ("use_dspark", "use_dflash", "use_eagle", "uses_draft_model"):
        setattr(spec, name, types.MethodType(getattr(SpeculativeConfig, name), spec))
    view = types.SimpleNamespace(speculative_config=spec, scheduler_config=scheduler, diffusion_config=None)
    view.num_speculative_tokens = VllmConfig.num_speculative_tokens.fget(view)
    view.num_lookahead_tokens = VllmConfig.num_lookahead_tokens.fget(view)
    VllmConfig._set_max_num_scheduled_tokens(view)
    return scheduler.max_num_active_seqs


def hybrid_prefix_caching(engine) -> bool:
    """The prefix-caching setting vLLM ends with for a hybrid generative model (K3)."""
    from vllm.config import ModelConfig
    model = types.SimpleNamespace(attn_type="hybrid", pooler_config=None, runner_type="generate")
    model.is_chunked_prefill_supported = ModelConfig.is_chunked_prefill_supported.fget(model)
    model.is_prefix_caching_supported = ModelConfig.is_prefix_caching_supported.fget(model)
    engine._set_default_chunked_prefill_and_prefix_caching_args(model)
    return bool(engine.enable_prefix_caching)


def one(serve, folder: str, case: dict) -> dict:
    from vllm.config import ParallelConfig
    from vllm.models.kimi_k3.nvidia.specialized_decode.runtime import providers
    argv = case["argv"]
    result, _, engine = serve.parse_objects(argv)
    if engine is None:
        return result
    sc = engine.speculative_config or {}
    tokens = sc.get("num_speculative_tokens")
    out = {"ok": True, "all2all_backend": ParallelConfig(
        tensor_parallel_size=engine.tensor_parallel_size, enable_expert_parallel=engine.enable_expert_parallel,
        all2all_backend=engine.all2all_backend).all2all_backend,
        "megakernel_max_tokens": providers.PREPARED_MAX, "prefix_caching": hybrid_prefix_caching(engine)}
    out["dspark_max_num_active_seqs"] = dspark_active_seqs(engine, tokens) if sc.get("method") == "dspark" else None
    out |= whole_config(serve, folder, argv, bool(case["sm100"]), tokens)
    return out


def main() -> int:
    serve, folder = vllm_parse.Serve(), stand_in_dir()
    for case in json.load(sys.stdin):
        try:
            res = one(serve, folder, case)
        except Exception:  # noqa: BLE001 - reported as data, the test names the case
            res = {"ok": False, "error": traceback.format_exc(limit=4)}
        res["name"] = case["name"]
        print(json.dumps(res), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
