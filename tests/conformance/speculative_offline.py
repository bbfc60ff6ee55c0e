"""Build vLLM's own SpeculativeConfig for each drafter named on the command line, offline.

Runs inside the pinned vLLM 0.33.0 venv (it needs vllm, torch, transformers):
    HF_HUB_OFFLINE=1 python speculative_offline.py TARGET_DIR SPECULATIVE_CONFIG_JSON [MODEL ...]
The target's ``ModelConfig`` is built from ``TARGET_DIR`` as ``vllm serve`` would; then, for each
MODEL, ``SpeculativeConfig(**config, model=MODEL, target_model_config=..., target_parallel_config=...)``.
Prints one JSON line per MODEL: ``{"model", "ok", "method", "draft_model", "error"}``.
"""

from __future__ import annotations

import json
import sys


def main(target: str, config_json: str, models: list[str]) -> None:
    from vllm.config import ModelConfig, ParallelConfig, SpeculativeConfig

    target_config = ModelConfig(model=target, tokenizer=target, max_model_len=2048, trust_remote_code=True)
    config = json.loads(config_json)
    for model in models:
        try:
            sc = SpeculativeConfig(**{**config, "model": model}, target_model_config=target_config,
                                   target_parallel_config=ParallelConfig())
            out = {"model": model, "ok": True, "method": sc.method, "draft_model": sc.draft_model_config.model}
        except Exception as exc:  # noqa: BLE001 - vLLM's verdict, reported as data
            out = {"model": model, "ok": False, "error": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
