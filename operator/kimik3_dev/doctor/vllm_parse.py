"""Parse `vllm serve` argument lists with vLLM's own parser; run vLLM's GPU-free config checks.

Runs with the python of a vLLM virtualenv (tools/vllm-envs.sh), never the operator's:
    VLLM_TARGET_DEVICE=cpu <venv>/bin/python vllm_parse.py < requests.jsonl > results.jsonl
Importing vllm takes seconds, so one process answers many requests. Each input line is a JSON
object, and each gets one output line with the same "id":
  {"id": ..., "argv": [...]}         the arguments after `vllm serve`; parsed exactly as `vllm serve`
                                     does: make_arg_parser(FlexibleArgumentParser()), the positional
                                     model tag moved into --model (ServeSubcommand.cmd),
                                     validate_parsed_serve_args, AsyncEngineArgs.from_cli_args.
      -> {"id", "ok": true, "args": {every parsed serve option}, "engine": {every AsyncEngineArgs field}}
      -> {"id", "ok": false, "stage": "parse" | "validate" | "engine_args", "error": vLLM's message}
  {"id": ..., "checks": {"argv": [...], "env": {...}, "sm100_family": bool}}
                                     parses argv, then runs vLLM's GPU-free config checks on it
                                     (see config_checks).
      -> the parse result plus "problems": [{"check": name, "error": vLLM's message}, ...]
  {"id": ..., "engine_config": {"argv": [...], "headless": bool}}
                                     vLLM's create_engine_config on the parallel flags, with a
                                     stand-in MoE config.json: -> {"id", "ok", "parallel": {...}}
  {"id": ..., "version": true}       -> {"id", "ok": true, "version": vllm.__version__}
The first output line is {"ready": true, "version": ...} once vllm is imported.
This file imports only vLLM and the standard library; it holds no copy of vLLM code.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import io
import json
import os
import sys
import traceback

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

K3_MAX_MODEL_LEN = 1048576
"""Kimi K3's context length, tokens (its published config): vLLM's max_model_len when --max-model-len is unset."""


def jsonable(value, depth: int = 0):
    """A JSON value for a parsed option: dataclass/pydantic configs become dicts of their fields."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, dict):
        return {str(k): jsonable(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [jsonable(v, depth + 1) for v in value]
    if depth < 3 and dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: jsonable(getattr(value, f.name, None), depth + 1) for f in dataclasses.fields(value)}
    return repr(value)


def last_error_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    errors = [ln for ln in lines if "error:" in ln]
    return (errors or lines or ["(no message)"])[-1].strip()


class Serve:
    """vLLM's `vllm serve` argument handling, imported from whichever layout this vLLM has."""

    def __init__(self) -> None:
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.utils.argparse_utils import FlexibleArgumentParser
        try:  # 0.33 layout
            from vllm.entrypoints.common.cli_args import make_arg_parser
            try:
                from vllm.entrypoints.common.cli_args import validate_parsed_serve_args
            except ImportError:
                validate_parsed_serve_args = None
        except ImportError:  # 0.32 layout
            from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
        self.engine_args_cls = AsyncEngineArgs
        self.parser_cls = FlexibleArgumentParser
        self.make_arg_parser = make_arg_parser
        self.validate = validate_parsed_serve_args
        self.parser = self.new_parser()

    def new_parser(self):
        return self.make_arg_parser(self.parser_cls(prog="vllm serve"))

    def parse(self, argv: list[str]) -> dict:
        return self.parse_objects(argv)[0]

    def parse_objects(self, argv: list[str]):
        """(result dict, argparse namespace or None, AsyncEngineArgs or None)."""
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                args = self.parser.parse_args(list(argv))
        except SystemExit as exc:
            self.parser = self.new_parser()  # argparse may be left half-way: start clean
            return {"ok": False, "stage": "parse", "exit": exc.code, "error": last_error_line(err.getvalue())}, None, None
        if getattr(args, "model_tag", None) is not None:  # what ServeSubcommand.cmd does
            args.model = args.model_tag
        if self.validate is not None:
            try:
                self.validate(args)
            except Exception as exc:  # noqa: BLE001 - vLLM raises TypeError/ValueError here
                return {"ok": False, "stage": "validate", "error": f"{type(exc).__name__}: {exc}"}, args, None
        try:
            engine = self.engine_args_cls.from_cli_args(args)
        except Exception as exc:  # noqa: BLE001
            return {"ok": False, "stage": "engine_args", "error": f"{type(exc).__name__}: {exc}"}, args, None
        fields = {f.name for f in dataclasses.fields(engine)}
        return {
            "ok": True,
            "args": {k: jsonable(v) for k, v in vars(args).items() if k not in fields and not callable(v)},
            "engine": {name: jsonable(getattr(engine, name)) for name in sorted(fields)},
        }, args, engine


def config_checks(serve: Serve, argv: list[str], env: dict[str, str], sm100_family: bool) -> dict:
    """Run vLLM's own configuration checks that need neither a GPU nor the checkpoint.

    Each check builds vLLM's real config class (or calls vLLM's own check function) from the
    parsed arguments; a rejection is reported with the check's name and vLLM's message:
    - ``CacheConfig``: kv-cache / mamba cache dtypes and memory settings (pydantic validators);
    - ``ObservabilityConfig``: --custom-histogram-buckets;
    - ``SchedulerConfig``: the batch limits (--max-num-batched-tokens against --max-num-seqs and
      the context length, ``verify_max_model_len``), at Kimi K3's context length when
      --max-model-len is unset;
    - ``SpeculativeConfig.fields``: every --speculative-config key is a SpeculativeConfig field and
      its value passes that field's type (method, sample methods, counts...);
    - ``SpeculativeConfig``: the whole config, built as vLLM builds it, for methods that need no
      draft checkpoint (ngram); ``SpeculativeConfig.draft_tp``: vLLM's draft-TP rule;
    - ``specialized_decode``: with --additional-config decode_backend, vLLM 0.33's own
      ``specialized_decode_config`` / ``unsupported`` list (vllm/models/kimi_k3/nvidia/
      specialized_decode/runtime). What needs a GPU or the checkpoint is supplied, not guessed:
      the GPU family from the accelerator profile (``sm100_family``), the model's MoE fields and
      dtype from Kimi K3's published config; the rest are vLLM's real config objects built from
      the parsed arguments and ``env`` (the engine container's environment).
    """
    result, args, engine = serve.parse_objects(argv)
    if engine is None:
        return result
    problems: list[dict] = []

    def attempt(name, fn):
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001 - vLLM's verdict, reported as data
            problems.append({"check": name, "error": f"{type(exc).__name__}: {exc}"})
            return None

    from vllm.config import CacheConfig, ParallelConfig, SchedulerConfig, SpeculativeConfig
    try:
        from vllm.config import ObservabilityConfig
    except ImportError:
        ObservabilityConfig = None
    e = engine
    offload = {k: getattr(e, k) for k in ("kv_offloading_size", "kv_offloading_backend") if hasattr(e, k)}
    cache = attempt("CacheConfig", lambda: CacheConfig(
        cache_dtype=e.kv_cache_dtype, gpu_memory_utilization=e.gpu_memory_utilization,
        mamba_cache_dtype=e.mamba_cache_dtype, mamba_ssm_cache_dtype=e.mamba_ssm_cache_dtype,
        use_replayssm=getattr(e, "use_replayssm", False), enable_prefix_caching=bool(e.enable_prefix_caching),
        **offload))
    if ObservabilityConfig is not None and getattr(e, "custom_histogram_buckets", None) is not None:
        attempt("ObservabilityConfig", lambda: ObservabilityConfig(custom_histogram_buckets=e.custom_histogram_buckets))
    scheduler_kwargs = {} if e.enable_chunked_prefill is None else {"enable_chunked_prefill": e.enable_chunked_prefill}
    attempt("SchedulerConfig", lambda: SchedulerConfig(
        max_num_seqs=e.max_num_seqs, max_num_batched_tokens=e.max_num_batched_tokens,
        max_model_len=e.max_model_len or K3_MAX_MODEL_LEN, is_encoder_decoder=False, **scheduler_kwargs))
    parallel = attempt("ParallelConfig", lambda: ParallelConfig(
        tensor_parallel_size=e.tensor_parallel_size, pipeline_parallel_size=e.pipeline_parallel_size,
        enable_expert_parallel=e.enable_expert_parallel, enable_dbo=e.enable_dbo,
        decode_context_parallel_size=e.decode_context_parallel_size))

    spec_obj = None
    sc = dict(e.speculative_config or {})
    if sc:
        pfields = getattr(SpeculativeConfig, "__pydantic_fields__", None) or {
            f.name: f for f in dataclasses.fields(SpeculativeConfig)}
        from pydantic import TypeAdapter

        def fields_ok():
            unknown = sorted(k for k in sc if k not in pfields)
            if unknown:
                raise TypeError(f"not SpeculativeConfig fields: {unknown}")
            for key, value in sc.items():
                annotation = getattr(pfields[key], "annotation", None) or pfields[key].type
                TypeAdapter(annotation).validate_python(value)
        attempt("SpeculativeConfig.fields", fields_ok)
        if parallel is not None and "draft_tensor_parallel_size" in sc:
            attempt("SpeculativeConfig.draft_tp", lambda: SpeculativeConfig._verify_and_get_draft_tp(
                parallel, sc["draft_tensor_parallel_size"]))
        if sc.get("method") == "ngram" and parallel is not None:
            spec_obj = attempt("SpeculativeConfig", lambda: SpeculativeConfig(
                **sc, target_model_config=None, target_parallel_config=parallel))

    backend = (e.additional_config or {}).get("decode_backend", "auto")
    unavailable = []
    if backend != "auto" and parallel is not None and cache is not None:
        try:
            import vllm.models.kimi_k3.nvidia.specialized_decode.runtime  # noqa: F401 - new in 0.33.0
        except ImportError:
            unavailable.append("specialized_decode (this vLLM has no megakernel decode path)")
        else:
            problems += specialized_decode_checks(e, parallel, cache, spec_obj, sc, env, sm100_family)
    result = dict(result)
    result["problems"] = problems
    result["unavailable"] = unavailable
    return result


def specialized_decode_checks(e, parallel, cache, spec_obj, sc, env, sm100_family) -> list[dict]:
    """vLLM 0.33's specialized_decode_config(vllm_config) on the deployment's real config parts."""
    import types
    from unittest import mock

    import torch

    from vllm import envs
    from vllm.config import CompilationMode, CUDAGraphMode
    from vllm.models.kimi_k3.nvidia.specialized_decode import runtime as sd
    from vllm.platforms import current_platform
    try:
        from vllm.config.vllm import OPTIMIZATION_LEVEL_TO_CONFIG
    except ImportError:
        OPTIMIZATION_LEVEL_TO_CONFIG = {}

    compilation = e.compilation_config
    level = getattr(e, "optimization_level", None)
    if OPTIMIZATION_LEVEL_TO_CONFIG and level is not None:  # the parser may leave "-O3" as the string "3"
        level = type(next(iter(OPTIMIZATION_LEVEL_TO_CONFIG)))(int(level))
    level_defaults = OPTIMIZATION_LEVEL_TO_CONFIG.get(level, {})
    # VllmConfig's own resolution of what the arguments leave unset: eager -> no graphs and no
    # compilation; otherwise the optimization level's cudagraph mode and VLLM_COMPILE.
    if e.enforce_eager:
        graphs, mode = CUDAGraphMode.NONE, CompilationMode.NONE
    else:
        graphs = compilation.cudagraph_mode or level_defaults.get("compilation_config", {}).get("cudagraph_mode")
        mode = compilation.mode if compilation.mode is not None else CompilationMode.VLLM_COMPILE
    view_compilation = types.SimpleNamespace(cudagraph_mode=graphs, mode=mode,
                                             cudagraph_capture_sizes=compilation.cudagraph_capture_sizes)
    if spec_obj is None and sc:
        spec_obj = types.SimpleNamespace(method=sc.get("method"), num_speculative_tokens=sc.get("num_speculative_tokens"),
                                         enable_adaptive_verification=bool(sc.get("enable_adaptive_verification")))
    # Kimi K3's published text config (the fields the check compares) and its BF16 backbone.
    k3_text = types.SimpleNamespace(hidden_act="situ", activation_situ_beta=4.0, activation_situ_linear_beta=25.0,
                                    num_experts=896, num_experts_per_token=16, num_expert_group=1, topk_group=1,
                                    moe_router_activation_func="sigmoid")
    model = types.SimpleNamespace(hf_text_config=k3_text, dtype=torch.bfloat16, enable_sleep_mode=e.enable_sleep_mode,
                                  max_model_len=e.max_model_len or K3_MAX_MODEL_LEN)
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        runner_v2 = envs.VLLM_USE_V2_MODEL_RUNNER
        view = types.SimpleNamespace(
            additional_config=e.additional_config, parallel_config=parallel, speculative_config=spec_obj,
            model_config=model, compilation_config=view_compilation, cache_config=cache,
            lora_config=object() if e.enable_lora else None,
            use_v2_model_runner=True if runner_v2 is None else bool(runner_v2))
        with mock.patch.object(type(current_platform), "is_device_capability_family",
                               lambda *a, **k: sm100_family, create=True):
            sd.specialized_decode_config(view)
        return []
    except Exception as exc:  # noqa: BLE001
        return [{"check": "specialized_decode", "error": f"{type(exc).__name__}: {exc}"}]
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


STAND_IN_MOE = {
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 128, "intermediate_size": 256,
    "moe_intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 64, "num_key_value_heads": 64,
    "head_dim": 64, "num_experts": 128, "num_experts_per_tok": 2, "vocab_size": 512, "max_position_embeddings": 4096,
    "torch_dtype": "bfloat16", "rms_norm_eps": 1e-6, "rope_theta": 10000, "decoder_sparse_step": 1,
    "norm_topk_prob": True, "tie_word_embeddings": False,
}
"""A config.json only (no weights, no tokenizer) of a small MoE model vLLM knows natively: Kimi K3's
own config needs its checkpoint's remote code. 64 heads and 128 experts divide every TP/EP size
the operator plans; what is read from it here is the data-parallel launch logic, not the model."""
_stand_in_dir: str | None = None


def engine_config(serve: Serve, argv: list[str], headless: bool) -> dict:
    """vLLM's own EngineArgs.create_engine_config for ``argv`` (parallel flags only, after a
    stand-in MoE model), as `vllm serve` runs it on that node: the ParallelConfig it settles on
    (data-parallel rank, load-balancing mode, addresses), computed by vLLM on the CPU."""
    global _stand_in_dir
    import tempfile
    if _stand_in_dir is None:
        _stand_in_dir = tempfile.mkdtemp(prefix="kimik3-moe-")
        with open(os.path.join(_stand_in_dir, "config.json"), "w", encoding="utf-8") as fh:
            json.dump(STAND_IN_MOE, fh)
    result, args, engine = serve.parse_objects([_stand_in_dir, "--max-model-len", "2048", "--skip-tokenizer-init", *argv])
    if engine is None:
        return result
    try:
        cfg = engine.create_engine_config(headless=headless)
    except Exception as exc:  # noqa: BLE001 - vLLM's verdict
        return {"ok": False, "stage": "create_engine_config", "error": f"{type(exc).__name__}: {exc}"}
    p = cfg.parallel_config
    return {"ok": True, "parallel": {k: jsonable(getattr(p, k, None)) for k in (
        "tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size", "data_parallel_size_local",
        "data_parallel_rank", "data_parallel_hybrid_lb", "data_parallel_external_lb", "data_parallel_master_ip",
        "data_parallel_rpc_port", "enable_expert_parallel", "nnodes", "node_rank", "master_addr", "master_port")}}


def main() -> int:
    import vllm

    serve = Serve()
    out = sys.stdout
    print(json.dumps({"ready": True, "version": vllm.__version__}), file=out, flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        rid = req.get("id")
        try:
            if "argv" in req:
                res = serve.parse(req["argv"])
            elif "checks" in req:
                c = req["checks"]
                res = config_checks(serve, c["argv"], c.get("env", {}), bool(c.get("sm100_family", True)))
            elif "engine_config" in req:
                c = req["engine_config"]
                res = engine_config(serve, c["argv"], bool(c.get("headless")))
            elif req.get("version"):
                res = {"ok": True, "version": vllm.__version__}
            else:
                res = {"ok": False, "stage": "request", "error": f"unknown request keys {sorted(req)}"}
        except Exception:  # noqa: BLE001 - a helper bug, not a vLLM verdict: say so
            res = {"ok": False, "stage": "helper", "error": traceback.format_exc(limit=3)}
        res["id"] = rid
        print(json.dumps(res), file=out, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
