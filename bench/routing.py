#!/usr/bin/env python3
"""Prefix- and load-aware routing against connection-level spread (issue 27 item 6): one Mooncake
trace replayed through a deployment's Service and through the inference gateway's endpoint picker,
on the same TP8 groups of one dev cluster.

    source tools/env.sh && nice -n 5 python bench/routing.py [--groups 4] [--compression 4]
        [--kv-offload 1000Gi|none] [--trace bench/traces/mooncake-synthetic.jsonl] [--first-s S] [--seed 0]
        [--no-plots]

1. ``DevCluster.up``: ``--groups`` GB300 racks of 2 trays (one TP8 group each), no Prometheus; one
   KimiK3Deployment (``recipes/gb300-tp8-megakernel-dspark.yaml``, ``--groups`` replicas, prefix
   caching on as vLLM 0.33 has it, a host KV tier of ``--kv-offload`` per group
   (``spec.engine.kvOffload``: 1000Gi by default, 500Gi on each of a group's 2 trays), simulated
   model load 1 s) until its Service answers; an
   InferencePool (FailClose) over its leaders and the gateway started (``DevCluster.start_gateway``:
   EPP v1.2.1 with the configuration the operator renders for the deployment, ``render.routing``:
   prefix-cache 3, queue 2, KV-cache 2, the prefix index sized to the GPU and host blocks; Envoy).
2. The trace (``tracefile.read``, arrivals divided by ``--compression``) replayed
   (``load.run_trace``, streaming completions) through the Service stand-in (``load.resolve_url``:
   each new connection to a Ready leader at random, kube-proxy's way), then through Envoy. The
   second replay's hash ids are shifted past the first's (as ``tracefile.superpose`` does for a
   copy), so the blocks the first left in the engines' caches share nothing with it: both start cold.
3. Per path: TTFT P50/P90 and per-token latency P90 (``load.summarize``, client-side); the
   prefix-cache hit rate, hits / queries, from the difference of every leader's
   ``vllm:prefix_cache_hits`` (GPU) plus ``vllm:external_prefix_cache_hits`` (loaded from the host
   tier) over ``vllm:prefix_cache_queries`` before and after (and each leader's share of the queried
   tokens); requests per second that met the SLO (``routing.goodput``: TTFT <=
   ``TTFT_TARGET_S``, 2 s, and the request's P90 per token <= ``TARGET_S``, 5 ms, the autoscaling
   benchmark's SLO) over the replay's arrival span; the hit rate over the trace's reuse ceiling
   (``tracefile.reuse_ceiling``, 512-token blocks), over what the engines can count at most
   (``routing.cache_ceiling`` unbounded: 1024-token blocks, the last token never matched) and over
   what one LRU cache of all the groups' blocks reaches (``routing.cache_ceiling`` of
   ``--groups`` x the GPU and host blocks ``kvcache.spec_kv_blocks`` gives a group: the capacity
   bound; and of the GPU blocks alone, the bound without the tier).

Writes ``bench/results/routing.json`` (``-o``; date, commit, arguments, trace, ceilings, both paths, the
issue's two done-when ratios) and, unless ``--no-plots``, the same name with ``.png`` (TTFT
distribution per path, hit rates against the ceilings). Not part of the test suite (~15 min on
the 2-core project machine at compression 4).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

import click
import requests

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "operator"))

from kimik3.admission import admit  # noqa: E402
from kimik3.engine.kvcache import spec_kv_blocks  # noqa: E402
from kimik3.kube.times import rfc3339  # noqa: E402
from kimik3_dev.benchmark import routing  # noqa: E402
from kimik3_dev.benchmark.simulate import TARGET_S, TTFT_TARGET_S  # noqa: E402
from kimik3_dev.devcluster import gateway  # noqa: E402
from kimik3_dev.devcluster.readiness import wait_for  # noqa: E402
from kimik3_dev.devcluster.scratch import NAME, recipe_deployment, serving_cluster  # noqa: E402
from kimik3_dev.sim import load, tracefile  # noqa: E402
from kimik3_dev.benchmark.provenance import checkout_commit  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "recipes" / "gb300-tp8-megakernel-dspark.yaml"
TRACE = REPO / "bench" / "traces" / "mooncake-synthetic.jsonl"
RESULTS = REPO / "bench" / "results" / "routing.json"
NAMESPACE = "bench-routing"
WAIT_S = 300.0
DRAIN_S = 120.0


def _shifted(replay: list[tracefile.Request], by: int) -> list[tracefile.Request]:
    return [replace(r, hash_ids=tuple(h + by for h in r.hash_ids)) for r in replay]


def _counts(leaders: dict[str, str]) -> dict[str, tuple[float, float, float]]:
    """(queries, GPU hits, host-tier hits) per leader (name -> base URL)."""
    return {name: routing.prefix_cache_tokens(requests.get(f"{url}/metrics", timeout=10).text)
            for name, url in leaders.items()}


def _replay(url: str, model: str | None, replay: list[tracefile.Request], seed: int,
            leaders: dict[str, str]) -> tuple[list[load.RequestResult], dict, float]:
    before = _counts(leaders)
    t0 = time.monotonic()
    results = asyncio.run(load.run_trace(url, replay, model=model, drain_s=DRAIN_S, seed=seed))
    wall = time.monotonic() - t0
    after = _counts(leaders)
    per = {name: tuple(a - b for a, b in zip(after[name], before[name])) for name in leaders}
    return results, per, wall


def _figures(results: list[load.RequestResult], per: dict[str, tuple[float, ...]], *, span_s: float,
             wall_s: float, ceiling: float, engine_ceiling: float, capacity_ceiling: float) -> dict:
    total = load.summarize(results)["total"]
    queries = sum(q for q, _, _ in per.values())
    gpu_hits = sum(h for _, h, _ in per.values())
    host_hits = sum(h for _, _, h in per.values())
    hits = gpu_hits + host_hits
    hit_rate = hits / queries if queries else None
    ms = (lambda v: None if v is None else round(1000 * v, 2))
    return {
        "requests": total["requests"], "ok": total["ok"], "errors": total["errors"],
        "error_kinds": total["error_kinds"],
        "ttft_p50_ms": ms(total["ttft_p50_s"]), "ttft_p90_ms": ms(total["ttft_p90_s"]),
        "itl_p90_ms": ms(total["itl_p90_s"]), "itl_p50_ms": ms(total["itl_p50_s"]),
        "slo_met": (total["ttft_p90_s"] or 1e9) <= TTFT_TARGET_S and (total["itl_p90_s"] or 1e9) <= TARGET_S,
        "goodput_rps": round(routing.goodput(results, span_s, TTFT_TARGET_S, TARGET_S), 3),
        "offered_rps": round(total["requests"] / span_s, 3),
        "prefix_cache": {"queries_tokens": queries, "hits_tokens": hits, "gpu_hits_tokens": gpu_hits,
                         "host_tier_hits_tokens": host_hits,
                         "hit_rate": None if hit_rate is None else round(hit_rate, 4),
                         "of_reuse_ceiling": None if hit_rate is None else round(hit_rate / ceiling, 4),
                         "of_engine_ceiling": None if hit_rate is None else round(hit_rate / engine_ceiling, 4),
                         "of_capacity_ceiling": None if hit_rate is None else round(hit_rate / capacity_ceiling, 4),
                         "queried_share_per_leader": {name: round(q / queries, 4) if queries else None
                                                      for name, (q, _, _) in sorted(per.items())}},
        "wall_s": round(wall_s, 1),
    }


def _plot(runs: dict[str, list[load.RequestResult]], out: dict, png: Path) -> None:
    import matplotlib  # the [bench] extra
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for path, results in runs.items():
        ttft = sorted(r.ttft for r in results if r.ok and r.ttft is not None)
        left.plot(ttft, [(i + 1) / len(ttft) for i in range(len(ttft))], label=path)
    left.axvline(TTFT_TARGET_S, color="grey", ls=":", label=f"TTFT target {TTFT_TARGET_S:g} s")
    left.set_xscale("log")
    left.set_xlabel("TTFT (s)")
    left.set_ylabel("share of requests")
    left.set_title("TTFT distribution")
    left.legend()
    names = list(runs)
    rates = [out["paths"][p]["prefix_cache"]["hit_rate"] or 0 for p in names]
    right.bar(names, rates, color=["tab:blue", "tab:orange"][:len(names)])
    right.axhline(out["trace"]["reuse_ceiling"], color="black", ls="--", label="reuse ceiling (512-token blocks)")
    right.axhline(out["trace"]["engine_ceiling"], color="grey", ls=":", label="engine ceiling (1024-token blocks)")
    right.axhline(out["trace"]["capacity_ceiling"], color="tab:red", ls="-.",
                  label="one LRU cache of the pool's GPU + host blocks")
    right.axhline(out["trace"]["gpu_capacity_ceiling"], color="tab:purple", ls=":",
                  label="one LRU cache of the pool's GPU blocks")
    right.set_ylim(0, 1)
    right.set_ylabel("prefix-cache hit rate (tokens)")
    right.set_title("engines' prefix-cache hits / queries")
    right.legend(loc="upper left")
    fig.suptitle(f"{out['groups']} TP8 groups, {out['trace']['file']} x{out['trace']['compression']:g} faster")
    fig.tight_layout()
    fig.savefig(png, dpi=110)


@click.command()
@click.option("--groups", default=4, show_default=True, help="TP8 groups (one rack of 2 trays each).")
@click.option("--compression", default=4.0, show_default=True, help="Trace time compression.")
@click.option("--kv-offload", default="1000Gi", show_default=True,
              help="spec.engine.kvOffload.size of the deployment (each group's host KV tier), or none.")
@click.option("--trace", "trace_file", default=str(TRACE.relative_to(REPO)), show_default=True)
@click.option("--first-s", type=float, default=None,
              help="Replay only the requests of the trace's first this many (recorded) seconds.")
@click.option("--seed", default=0, show_default=True, help="Seed of the prompt words past the hash ids.")
@click.option("--plots/--no-plots", default=True, show_default=True)
@click.option("-o", "--out", "out_file", default=str(RESULTS.relative_to(REPO)), show_default=True,
              help="Results file (the plot beside it, .png).")
def main(groups: int, compression: float, kv_offload: str, trace_file: str, first_s: float | None, seed: int,
         plots: bool, out_file: str) -> None:
    if plots and importlib.util.find_spec("matplotlib") is None:
        raise click.UsageError("the plots need matplotlib, the [bench] extra: pip install -e '.[bench]' "
                               "(or --no-plots)")
    load_before = os.getloadavg()
    commit = checkout_commit(REPO)
    replay = [r for r in tracefile.read(REPO / trace_file, compression)
              if first_s is None or r.arrival_s * compression < first_s]
    span_s = max(r.arrival_s for r in replay)
    ceiling = tracefile.reuse_ceiling(replay)
    if ceiling is None:
        raise click.BadParameter(f"{trace_file} has no hash_ids: nothing to cache (want a Mooncake JSONL trace)",
                                 param_hint="--trace")
    cr = recipe_deployment(RECIPE, NAMESPACE, groups)
    if kv_offload != "none":
        cr["spec"]["engine"]["kvOffload"] = {"size": kv_offload}
    kv = spec_kv_blocks(admit(cr["spec"]).spec)  # refuses a tier no tray holds before anything starts
    engine_ceiling = routing.cache_ceiling(replay, kv.block_size)
    capacity_ceiling = routing.cache_ceiling(replay, kv.block_size, groups * kv.blocks, groups * kv.host_blocks)
    gpu_capacity_ceiling = routing.cache_ceiling(replay, kv.block_size, groups * kv.blocks)
    if min(ceiling, engine_ceiling) <= 0:
        span = "the whole trace" if first_s is None else f"the first {first_s:g} s"
        raise click.BadParameter(f"the {len(replay)} requests of {span} reuse no prefix an engine can count "
                                 f"(reuse ceiling {ceiling:.3f}, {kv.block_size}-token blocks {engine_ceiling:.3f}): "
                                 "nothing to route by; give a longer --first-s", param_hint="--first-s")
    with serving_cluster(cr, groups, WAIT_S, "kimik3-bench-routing-") as served:
        leaders = gateway.pool_over_leaders(served.rest, NAMESPACE, NAME)
        gw = served.cluster.start_gateway(NAMESPACE, NAME, timeout_s=WAIT_S)
        wait_for("endpoint picker", lambda: gateway.pool_gauge(
            requests.get(f"{gw.epp_metrics_url}/metrics", timeout=5).text, "inference_pool_ready_pods",
            gw.pool) == groups or f"not {groups} ready pods yet", WAIT_S)
        stride = max((h for r in replay for h in r.hash_ids), default=-1) + 1
        runs: dict[str, list[load.RequestResult]] = {}
        per_path: dict[str, tuple[dict, float]] = {}
        for i, (path, url) in enumerate((("service", served.url), ("picker", gw.url))):
            print(f"{path}: {len(replay)} requests over {span_s:.0f} s through {url}", flush=True)
            results, per, wall = _replay(url, served.model, _shifted(replay, i * stride), seed + i, leaders)
            runs[path], per_path[path] = results, (per, wall)
            print(load.format_summary(load.summarize(results)), flush=True)
        gateway.stop(served.cluster.state_dir, gw)
    out = {
        "what": f"one Mooncake trace replayed through a deployment's Service (connection-level spread) and through "
                f"the endpoint picker (EPP v1.2.1 + Envoy) on the same {groups} GB300 TP8 groups of one dev cluster",
        "date": rfc3339(),
        "commit": commit,
        "command": f"nice -n 5 python bench/routing.py --groups {groups} --compression {compression:g} "
                   f"--kv-offload {kv_offload} "
                   f"--trace {trace_file} --seed {seed}"
                   + ("" if first_s is None else f" --first-s {first_s:g}") + f" -o {out_file}" + ("" if plots else " --no-plots"),
        "groups": groups,
        "recipe": str(RECIPE.relative_to(REPO)),
        "engine_prefix_cache": {"block_tokens": kv.block_size, "blocks_per_group": kv.blocks,
                                "tokens_per_group": kv.tokens, "host_tier": kv_offload,
                                "host_blocks_per_group": kv.host_blocks, "host_tokens_per_group": kv.host_tokens},
        "trace": {"file": trace_file, "first_s": first_s, "requests": len(replay), "compression": compression,
                  "arrival_span_s": round(span_s, 1),
                  "prompt_tokens_mean": round(sum(r.prompt_tokens for r in replay) / len(replay)),
                  "output_tokens_mean": round(sum(r.output_tokens for r in replay) / len(replay)),
                  "reuse_ceiling": round(ceiling, 4), "engine_ceiling": round(engine_ceiling, 4),
                  "capacity_ceiling": round(capacity_ceiling, 4),
                  "gpu_capacity_ceiling": round(gpu_capacity_ceiling, 4)},
        "slo": {"ttft_p90_s": TTFT_TARGET_S, "per_token_p90_s": TARGET_S,
                "goodput": "requests/s over the arrival span whose TTFT <= the TTFT target and whose own P90 per "
                           "token <= the per-token target"},
        "paths": {path: _figures(runs[path], per_path[path][0], span_s=span_s, wall_s=per_path[path][1],
                                 ceiling=ceiling, engine_ceiling=engine_ceiling, capacity_ceiling=capacity_ceiling)
                  for path in runs},
    }
    service, picker = out["paths"]["service"], out["paths"]["picker"]
    out["done_when"] = {
        "ttft_p90_service_over_picker": round(service["ttft_p90_ms"] / picker["ttft_p90_ms"], 3),
        "ttft_p90_wanted": 2.0,
        "picker_hit_rate_of_reuse_ceiling": picker["prefix_cache"]["of_reuse_ceiling"],
        "hit_rate_wanted": 0.8,
    }
    out["machine"] = f"2 cores, shared; load average {load_before[0]:.1f} at start, {os.getloadavg()[0]:.1f} at the end"
    results_file = REPO / out_file
    if plots:
        out["plot"] = str(results_file.with_suffix(".png").relative_to(REPO))
    results_file.write_text(json.dumps(out, indent=2) + "\n")
    if plots:
        _plot(runs, out, results_file.with_suffix(".png"))
    print(json.dumps({k: v for k, v in out.items() if k != "paths"} | {"paths": out["paths"]}, indent=2))


if __name__ == "__main__":
    main()
