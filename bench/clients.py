#!/usr/bin/env python3
"""Two load clients, one engine, the same load: ``kimik3 dev load`` and vLLM's ``vllm bench serve``.

    python bench/clients.py [-f recipes/gb300-tp8-megakernel-dspark.yaml] [--requests 200] [--rate 8]
                            [--prompt-tokens 512] [--output-tokens 256] [--seed 0]
                            [--url http://127.0.0.1:PORT -o bench/results/clients-demo.json]

Starts one simulated engine on 127.0.0.1 (``kimik3_dev.sim.engine``) configured as the recipe's
deployment renders one group (shape, served model name, max_num_seqs), then runs against it, one
after the other:
- ``kimik3 dev load --url`` (the kit's CLI, a process): ``--requests`` streamed completions at an
  open-loop Poisson ``--rate``, ``--prompt-tokens`` / ``--output-tokens`` each;
- ``vllm bench serve`` (vLLM 0.32 from the vllm-cpu venv, tools/vllm-envs.sh; ``kimik3_dev.sim.vllm_bench``):
  the same number of streamed completions at the same Poisson rate, its random dataset with prompts
  of exactly ``--prompt-tokens`` tokens of the simulated model's tokenizer, ``--output-tokens`` each.
Each tool's TTFT and TPOT P50/P90 are its own (dev load: nearest rank over its requests; vLLM:
numpy's linear interpolation); TPOT is per request, (last chunk - first chunk) / (tokens - 1), in
both. Writes bench/results/clients.json (date, commit, the load, both tools' figures, failed
requests) and prints it. With ``--url`` no engine is started: both clients load that endpoint
instead (e.g. the Service of ``tools/kimik3 demo``'s deployment on ``dev up``, whose stand-in
address ``kimik3 dev status`` prints; the recipe should be the one the endpoint serves), and
``-o`` names the results file.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "operator"))

import yaml  # noqa: E402

from kimik3.admission import admit  # noqa: E402
from kimik3.autoscaler import perfmodel as pm  # noqa: E402
from kimik3.kube.times import rfc3339  # noqa: E402
from kimik3_dev.doctor import PARSER_VENVS  # noqa: E402
from kimik3_dev.sim.engine import EngineConfig, SimEngine  # noqa: E402
from kimik3_dev.sim.vllm_bench import bench_serve  # noqa: E402
from kimik3_dev.versions import VLLM_CPU_VERSION  # noqa: E402
from kimik3_dev.benchmark.provenance import checkout_commit  # noqa: E402

RESULTS = REPO / "bench" / "results" / "clients.json"


def engine_config(recipe: Path, seed: int) -> EngineConfig:
    """The simulated engine of one group of the recipe's deployment."""
    (cr,) = [d for d in yaml.safe_load_all(recipe.read_text()) if d and d.get("kind") == "KimiK3Deployment"]
    admitted = admit(cr["spec"])
    spec = admitted.spec
    return EngineConfig(shape=pm.EngineShape.from_spec(spec, admitted.plan), model=spec.model.name,
                        served_model_name=spec.model.served_model_name, max_num_seqs=spec.engine.max_num_seqs,
                        seed=seed)


async def dev_load(url: str, args: argparse.Namespace) -> dict:
    """``kimik3 dev load --url`` as a process; its summary (``--json``)."""
    duration = 2 * args.requests / args.rate  # Poisson arrivals: --requests reached well before the end
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "kimik3.cli", "dev", "load", "--url", url, "--rate", str(args.rate),
        "--duration", f"{duration:.0f}s", "--max-requests", str(args.requests),
        "--prompt-tokens", str(args.prompt_tokens), "--output-tokens", str(args.output_tokens),
        "--seed", str(args.seed), "--json",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env=os.environ | {"PYTHONPATH": str(REPO / "operator")})
    out, err = await proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"kimik3 dev load exited {proc.returncode}: {err.decode()[-2000:]}")
    return json.loads(out)["summary"]["total"]


def ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1e3, 2)


async def run(args: argparse.Namespace) -> dict:
    venv = PARSER_VENVS[VLLM_CPU_VERSION]
    if not (venv / ".complete").is_file():
        raise SystemExit(f"no vllm-cpu {VLLM_CPU_VERSION} venv at {venv}: run tools/vllm-envs.sh cpu")
    config = engine_config(args.filename, args.seed)
    engine = None if args.url else SimEngine(config)
    if engine is not None:
        await engine.start()
    url = args.url or engine.url
    try:
        ours = await dev_load(url, args)
        with tempfile.TemporaryDirectory(prefix="kimik3-bench-clients-") as tmp:
            theirs = await bench_serve(venv / "bin" / "python", url, Path(tmp), requests=args.requests,
                                       prompt_tokens=args.prompt_tokens, output_tokens=args.output_tokens,
                                       rate=args.rate, seed=args.seed)
    finally:
        if engine is not None:
            await engine.stop()
    commit = checkout_commit(REPO)
    shape = config.shape
    return {
        "date": rfc3339(),
        "commit": commit,
        "command": "python bench/clients.py " + " ".join(sys.argv[1:]),
        "engine": {"recipe": os.path.relpath(args.filename, REPO), "accelerator": shape.accelerator, "strategy": shape.strategy,
                   "tensor_parallel_size": shape.tensor_parallel_size, "decode_backend": shape.decode_backend,
                   "speculative": f"{shape.spec_method} x{shape.k}", "workload": config.workload},
        "load": {"requests": args.requests, "rate_per_s": args.rate, "arrivals": "Poisson",
                 "prompt_tokens": args.prompt_tokens, "output_tokens": args.output_tokens, "stream": True,
                 "endpoint": "/v1/completions",
                 "server": args.url or "one SimEngine started by this command"},
        "kimik3_dev_load": {"requests": ours["requests"], "failed": ours["errors"],
                            "output_tokens": ours["output_tokens"],
                            "ttft_p50_ms": ms(ours["ttft_p50_s"]), "ttft_p90_ms": ms(ours["ttft_p90_s"]),
                            "tpot_p50_ms": ms(ours["tpot_p50_s"]), "tpot_p90_ms": ms(ours["tpot_p90_s"])},
        "vllm_bench_serve": {"vllm": VLLM_CPU_VERSION, "requests": theirs["completed"] + theirs["failed"],
                             "failed": theirs["failed"], "output_tokens": theirs["total_output_tokens"],
                             **{f"{m}_{p}_ms": round(theirs[f"{p}_{m}_ms"], 2)
                                for m in ("ttft", "tpot") for p in ("p50", "p90")},
                             "spec_decode_acceptance_length": round(theirs["spec_decode_acceptance_length"], 2)},
        "perf_model": {"tpot_batch1_ms": ms(pm.decode_point(shape, 1).tpot_s),
                       "ttft_unloaded_ms": ms(pm.ttft(shape, args.prompt_tokens))},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-f", "--filename", type=Path, default=REPO / "recipes" / "gb300-tp8-megakernel-dspark.yaml")
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--rate", type=float, default=8.0, help="requests/s, Poisson arrivals")
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--output-tokens", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--url", help="load this endpoint instead of starting an engine (e.g. the demo's Service)")
    parser.add_argument("-o", "--output", type=Path, default=RESULTS, help="the results file")
    args = parser.parse_args()
    result = asyncio.run(run(args))
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    print(f"wrote {args.output.resolve().relative_to(REPO)}")


if __name__ == "__main__":
    main()
