#!/usr/bin/env python3
"""Rollout benchmark (issue 12): an image change on 1, 3 and 6 groups under load, the default
Surge rollout (maxSurge 1, maxUnavailable 0) beside today's ``maxUnavailable: 1, maxSurge: 0``
rollout, in the same run on the same dev cluster.

    python bench/rollout.py [--load-time 8] [--groups 1,3,6]     # from the repository root

Starts ``kimik3 dev up --readiness-probes`` (7 GB300 racks of 2 trays: 6 TP8 groups and a surge
group, each alone in its rack; a leader is Ready only once its simulated engine has loaded),
and for each size and strategy applies a deployment in a fresh namespace, waits until it
serves, starts 4 closed-loop users on its front and changes the image
(``kimik3_dev.devcluster.rollout.measure_rollout``). Prints, per size and strategy: the time
taken (and in load times), the fewest Ready groups at any 0.1 s sample, the failed requests,
and Surge's time as a ratio of the baseline's. Writes bench/results/rollout.json.
"""

import argparse
import json
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "operator"))
sys.path.insert(0, str(REPO / "tests"))

from kimik3_dev.devcluster.cluster import DevCluster, UpOptions  # noqa: E402
from kimik3_dev.devcluster.racks import RackShape  # noqa: E402
from kimik3_dev.devcluster.rest import Rest  # noqa: E402
from kimik3_dev.devcluster.rollout import cr_path, measure_rollout, wait  # noqa: E402
from support.recipes import recipe  # noqa: E402

STRATEGIES = {"surge": {}, "maxUnavailable 1": {"maxSurge": 0, "maxUnavailable": 1}}
"""spec.rollout of each strategy: the default, and today's rollout before issue 12."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--load-time", type=float, default=8.0, help="simulated load time of a group, s")
    parser.add_argument("--groups", default="1,3,6", help="deployment sizes, comma-separated")
    args = parser.parse_args()
    sizes = [int(n) for n in args.groups.split(",")]
    results: dict[str, dict[str, dict[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="kimik3-bench-rollout-") as state:
        cluster = DevCluster(Path(state))
        cluster.up(UpOptions(shape=RackShape(profile="gb300", racks=max(sizes) + 1, trays_per_rack=2),
                             readiness_probes=True, load_time=f"{args.load_time:g}s", prometheus=False, kueue=False,
                             die_with_parent=True, wait_timeout_s=180.0))
        try:
            with cluster.api_client() as api:
                rest = Rest(api)
                for size in sizes:
                    for strategy, rollout in STRATEGIES.items():
                        ns = f"bench-{uuid.uuid4().hex[:6]}"
                        cr = recipe(name="k3", namespace=ns, replicas=size, rollout=rollout)
                        cr["metadata"]["annotations"] = {"inference.kimik3.io/sim-load-time": f"{args.load_time:g}s"}
                        done = measure_rollout(rest, Path(state), cr, {"engine": {"image": "vllm/vllm-openai:v0.33.1"}},
                                               timeout_s=120 + 4 * (size + 1) * args.load_time)
                        results.setdefault(str(size), {})[strategy] = {
                            "seconds": round(done.seconds, 1), "load_times": round(done.seconds / args.load_time, 2),
                            "fewest_ready": done.fewest_ready, "failed_requests": done.failed,
                            "requests": done.requests}
                        print(f"{size} group(s), {strategy}: {results[str(size)][strategy]}", flush=True)
                        rest.delete(cr_path(ns, "k3"))
                        wait(lambda: not rest.items(f"/api/v1/namespaces/{ns}/pods"), 180, f"the pods of {ns} to go")
                        rest.delete(f"/api/v1/namespaces/{ns}")
        finally:
            cluster.down()
    print(f"\nimage change under load, simulated load time {args.load_time:g} s, 4 users")
    print(f"{'groups':>6}  {'strategy':<17} {'seconds':>8} {'loads':>6} {'fewest Ready':>12} {'failed':>6} "
          f"{'time vs baseline':>16}")
    for size, by in results.items():
        base = by["maxUnavailable 1"]["seconds"]
        for strategy, r in by.items():
            print(f"{size:>6}  {strategy:<17} {r['seconds']:>8.1f} {r['load_times']:>6.2f} {r['fewest_ready']:>12} "
                  f"{r['failed_requests']:>6} {r['seconds'] / base:>15.2f}x")
    out = REPO / "bench" / "results" / "rollout.json"
    out.write_text(json.dumps({"load_time_s": args.load_time, "measured": time.strftime("%Y-%m-%d"),
                               "results": results}, indent=2) + "\n")
    print(f"wrote {out.relative_to(REPO)}")


if __name__ == "__main__":
    main()
