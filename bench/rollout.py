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

    python bench/rollout.py --bad [--window 50] [--releases slow,erroring,never-ready,corrupting]

The four bad releases of issue 25 instead (``BAD_RELEASES``, the simulator's knobs in the engine
env, with an image change), on one group, each with a canary and without, each twice in the same
run: with the protections of issue 25 (``PROTECTED``) and with them off (``BEFORE``, the operator's
behaviour before issue 25). One ``dev up --readiness-probes`` of 6 racks of 2 trays, no Prometheus
(the canary analysis scrapes the canary leaders: ``autoscaling.metricsSource.type: podScrape``), 4
users, a fixed window per release from its apply (``kimik3_dev.devcluster.rollout.measure_release``).
Prints and writes bench/results/rollout-bad.json, per release, canary or not, protections on or off:
the seconds to rollback complete (None: not rolled back in the window), to the bad revision serving
alone, the requests the bad revision's engines finished, and the users' failed requests.
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

from kimik3.kube.times import rfc3339  # noqa: E402
from kimik3_dev.devcluster.cluster import DevCluster, UpOptions  # noqa: E402
from kimik3_dev.devcluster.racks import RackShape  # noqa: E402
from kimik3_dev.devcluster.rest import Rest  # noqa: E402
from kimik3_dev.devcluster.rollout import cr_path, measure_release, measure_rollout, wait  # noqa: E402
from kimik3_dev.benchmark.provenance import checkout_commit  # noqa: E402
from support.recipes import recipe  # noqa: E402

STRATEGIES = {"surge": {}, "maxUnavailable 1": {"maxSurge": 0, "maxUnavailable": 1}}
"""spec.rollout of each strategy: the default, and today's rollout before issue 12."""

NEW_IMAGE = "vllm/vllm-openai:v0.33.1"

BAD_RELEASES = {"slow": {"KIMIK3_SIM_SLOWDOWN": "2"}, "erroring": {"KIMIK3_SIM_ERROR_RATE": "0.2"},
                "never-ready": {"KIMIK3_SIM_EXIT_CODE": "7"}, "corrupting": {"KIMIK3_SIM_CORRUPT_RATE": "0.6"}}
"""The engine env of each bad release (docs/rollouts.md, "Rehearsing a bad release"): every step
twice as long; 20% of requests fail with HTTP 500; the engine exits 7 at start (never Ready); 60% of
the golden prompts' greedy outputs diverge, latency and errors unchanged."""

CHECK_FIGURES = ("result", "latencySeconds", "errorRate", "requests", "message")
"""What the JSON keeps of each check of status.rollout.canary.history."""

LOAD_TIMEOUT = "15s"
"""probes.loadTimeout of every deployment: above the simulated load time, the floor of a deadline."""

FINE_ITL = [round(0.001 * i, 3) for i in range(1, 41)] + [0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5, 5.0]
"""ITL buckets 1 ms wide up to 40 ms (--custom-histogram-buckets, as tests/e2e/test_e2e_rollout.py):
vLLM's defaults cannot tell a step twice as slow from a healthy one."""


def canary(max_latency: str, protected: bool) -> dict[str, object]:
    """spec.rollout.canary: one canary group baking 20 s, checked every 5 s, rolled back after 2
    failed checks; protected: output parity on (the default) and 2 passing checks before a
    promotion; before issue 25: no parity, no probe requests, one passing check promotes."""
    analysis = {"interval": "5s", "failureLimit": 2, "maxLatency": max_latency, "maxErrorRate": 0.01}
    if protected:
        return {"groups": 1, "bake": "20s", "analysis": {**analysis, "minChecks": 2}}
    return {"groups": 1, "bake": "20s", "analysis": {**analysis, "minChecks": 1, "probeRequests": 0},
            "parity": {"enabled": False}}


def rollout_spec(with_canary: bool, protected: bool, max_latency: str) -> dict[str, object]:
    """spec.rollout of a run: Surge (maxSurge 1), a canary or none; protected: progressDeadline
    20 s (loadTimeout + 5 s); before issue 25 there was no deadline: left unset, its default
    (loadTimeout + 10m) is far past the window."""
    spec: dict[str, object] = {"progressDeadline": "20s"} if protected else {}
    if with_canary:
        spec["canary"] = canary(max_latency, protected)
    return spec


def bad_releases(args: argparse.Namespace) -> None:
    """The ``--bad`` run (module docstring)."""
    releases = args.releases.split(",")
    results: dict[str, dict[str, dict[str, dict[str, object]]]] = {}
    with tempfile.TemporaryDirectory(prefix="kimik3-bench-rollout-") as state:
        cluster = DevCluster(Path(state))
        cluster.up(UpOptions(shape=RackShape(profile="gb300", racks=6, trays_per_rack=2), readiness_probes=True,
                             load_time=f"{args.load_time:g}s", prometheus=False, kueue=False,
                             die_with_parent=True, wait_timeout_s=180.0))
        try:
            with cluster.api_client() as api:
                rest = Rest(api)
                for mode in ("canary", "no canary"):
                    for release in releases:
                        for protections in ("issue 25", "before"):
                            ns = f"bench-{uuid.uuid4().hex[:6]}"
                            rollout = rollout_spec(mode == "canary", protections == "issue 25", args.max_latency)
                            cr = recipe(name="k3", namespace=ns, replicas=1, rollout=rollout,
                                        probes={"loadTimeout": LOAD_TIMEOUT},
                                        autoscaling={"metricsSource": {"type": "podScrape"}})
                            cr["metadata"]["annotations"] = {
                                "inference.kimik3.io/sim-load-time": f"{args.load_time:g}s"}
                            cr["spec"]["engine"]["extraArgs"] = [
                                "--custom-histogram-buckets", json.dumps({"inter_token_latency": FINE_ITL})]
                            env = [{"name": k, "value": v} for k, v in BAD_RELEASES[release].items()]
                            done = measure_release(rest, Path(state), cr, {"engine": {"image": NEW_IMAGE, "env": env}},
                                                   window_s=args.window, timeout_s=args.window + 120)
                            row = {"rollback_s": None if done.rollback_s is None else round(done.rollback_s, 1),
                                   "took_over_s": None if done.took_over_s is None else round(done.took_over_s, 1),
                                   "served_by_bad": done.served_by_new, "failed_requests": done.failed,
                                   "requests": done.requests, "window_s": round(done.window_s, 1),
                                   "rolled_back": done.rolled_back and {k: done.rolled_back.get(k)
                                                                        for k in ("reason", "message")},
                                   "canary_checks": done.canary and [
                                       {k: h.get(k) for k in CHECK_FIGURES if h.get(k) not in (None, "")}
                                       for h in done.canary.get("history", [])],
                                   "rollout": rollout}
                            results.setdefault(release, {}).setdefault(mode, {})[protections] = row
                            print(f"{release}, {mode}, {protections}: {row}", flush=True)
                            rest.delete(cr_path(ns, "k3"))
                            rest.delete(f"/api/v1/namespaces/{ns}")
        finally:
            cluster.down()
    print(f"\nbad releases on 1 group, window {args.window:g} s from the apply, load time {args.load_time:g} s, "
          "4 users")
    print(f"{'release':<12} {'canary':<10} {'protections':<12} {'rollback s':>10} {'bad alone s':>11} "
          f"{'served by bad':>13} {'failed':>12}")
    for release, by_mode in results.items():
        for mode, by in by_mode.items():
            for protections, r in by.items():
                print(f"{release:<12} {mode:<10} {protections:<12} {str(r['rollback_s']):>10} "
                      f"{str(r['took_over_s']):>11} {r['served_by_bad']:>13} "
                      f"{str(r['failed_requests']) + ' of ' + str(r['requests']):>12}")
    out = REPO / "bench" / "results" / "rollout-bad.json"
    out.write_text(json.dumps({"measured": rfc3339(), "commit": checkout_commit(REPO),
                               "args": vars(args), "load_time_s": args.load_time, "window_s": args.window,
                               "releases": {k: BAD_RELEASES[k] for k in releases}, "new_image": NEW_IMAGE,
                               "load_timeout": LOAD_TIMEOUT, "results": results}, indent=2) + "\n")
    print(f"wrote {out.relative_to(REPO)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--load-time", type=float, default=8.0, help="simulated load time of a group, s")
    parser.add_argument("--groups", default="1,3,6", help="deployment sizes, comma-separated")
    parser.add_argument("--bad", action="store_true",
                        help="the four bad releases instead (bench/results/rollout-bad.json)")
    parser.add_argument("--releases", default=",".join(BAD_RELEASES), help="--bad: the releases, comma-separated")
    parser.add_argument("--window", type=float, default=50.0, help="--bad: seconds watched from each release's apply")
    parser.add_argument("--max-latency", default="9ms", help="--bad: canary analysis.maxLatency")
    args = parser.parse_args()
    if args.bad:
        bad_releases(args)
        return
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
                               "commit": checkout_commit(REPO),
                               "results": results}, indent=2) + "\n")
    print(f"wrote {out.relative_to(REPO)}")


if __name__ == "__main__":
    main()
