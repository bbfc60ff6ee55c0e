#!/usr/bin/env python3
"""Start time and cost of the dev cluster's inference gateway (``kimik3_dev.devcluster.gateway``):
the endpoint picker (EPP v1.2.1) and Envoy in front of an InferencePool over a deployment's leaders.

    source tools/env.sh && python bench/gateway.py [--groups 2] [--starts 3] [--requests 40]

1. ``DevCluster.up``: ``--groups`` GB300 racks of 2 trays (one TP8 group each), no Prometheus,
   ``die_with_parent``; one KimiK3Deployment (``recipes/gb300-tp8-megakernel-dspark.yaml``,
   ``--groups`` replicas, simulated model load 1 s) until its Service answers.
2. An InferencePool (FailClose) over its leaders at the engine port; ``--starts`` times: the gateway
   started (``DevCluster.start_gateway``: seconds from spawn to the picker having read the pool, and
   from Envoy's spawn to Envoy live with the picker healthy) and stopped, the last one kept.
3. ``--requests`` completions one after another (``max_tokens`` 1, distinct prompts) to the
   deployment's Service stand-in and through Envoy, alternating: the median and p90 of each, and
   the difference (what the ext_proc round trip and the picker's scheduling add per request here);
   the resident memory of the picker and of Envoy afterwards.

Writes ``bench/results/gateway.json`` (date, commit, machine load). Not part of the test suite
(~2-3 min on the 2-core project machine).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

import click
import requests

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "operator"))

from kimik3.kube.times import rfc3339  # noqa: E402
from kimik3_dev.devcluster import gateway, processes  # noqa: E402
from kimik3_dev.devcluster.scratch import NAME, recipe_deployment, serving_cluster  # noqa: E402
from kimik3_dev.benchmark.provenance import checkout_commit  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "recipes" / "gb300-tp8-megakernel-dspark.yaml"
RESULTS = REPO / "bench" / "results" / "gateway.json"
NAMESPACE = "bench-gateway"
WAIT_S = 240.0


def _timed_post(url: str, model: str | None, prompt: str) -> float:
    t0 = time.perf_counter()
    resp = requests.post(f"{url}/v1/completions", json={"model": model, "prompt": prompt, "max_tokens": 1},
                         timeout=30)
    took = time.perf_counter() - t0
    resp.raise_for_status()
    return took


def _summary(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {"p50_ms": round(1000 * statistics.median(ordered), 2),
            "p90_ms": round(1000 * ordered[int(0.9 * (len(ordered) - 1))], 2)}


@click.command()
@click.option("--groups", default=2, show_default=True)
@click.option("--starts", default=3, show_default=True)
@click.option("--requests", "count", default=40, show_default=True)
def main(groups: int, starts: int, count: int) -> None:
    load_before = os.getloadavg()
    cr = recipe_deployment(RECIPE, NAMESPACE, groups)
    with serving_cluster(cr, groups, WAIT_S, "kimik3-bench-gateway-") as served:
        cluster, service_url, model = served.cluster, served.url, served.model
        gateway.pool_over_leaders(served.rest, NAMESPACE, NAME)
        start_s: dict[str, list[float]] = {"epp": [], "envoy": []}
        for i in range(starts):
            gw = cluster.start_gateway(NAMESPACE, NAME, timeout_s=WAIT_S)
            for key in start_s:
                start_s[key].append(round(gw.start_s[key], 2))
            print(f"start {i + 1}: picker {gw.start_s['epp']:.2f} s, Envoy {gw.start_s['envoy']:.2f} s",
                  flush=True)
            if i < starts - 1:
                gateway.stop(cluster.state_dir, gw)
        latencies: dict[str, list[float]] = {"service": [], "gateway": []}
        for i in range(count):
            latencies["service"].append(_timed_post(service_url, model, f"service request {i}"))
            latencies["gateway"].append(_timed_post(gw.url, model, f"gateway request {i}"))
        rss = {"epp": processes.tree_rss_bytes(gw.epp.pid), "envoy": processes.tree_rss_bytes(gw.envoy.pid)}
        gateway.stop(cluster.state_dir, gw)
    service, through = _summary(latencies["service"]), _summary(latencies["gateway"])
    commit = checkout_commit(REPO)
    result = {
        "what": "the dev cluster's inference gateway (EPP v1.2.1 + Envoy 1.40.0) before an InferencePool of "
                f"{groups} TP8 leader(s): start times, added latency per completion, memory",
        "date": rfc3339(),
        "commit": commit,
        "command": f"python bench/gateway.py --groups {groups} --starts {starts} --requests {count}",
        "start_s": {key: {"runs": runs, "median": statistics.median(runs)} for key, runs in start_s.items()},
        "latency": {"service": service, "gateway": through,
                    "added_p50_ms": round(through["p50_ms"] - service["p50_ms"], 2),
                    "requests_each": count, "max_tokens": 1},
        "rss_mib": {key: round(value / (1 << 20), 1) for key, value in rss.items()},
        "machine": f"2 cores; load average {load_before[0]:.1f} at start, {os.getloadavg()[0]:.1f} at the end",
    }
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
