#!/usr/bin/env python3
"""Drain benchmark (issue 24 item 6): two trays of two different groups drained at once, as
``kubectl drain`` does it (cordon, a policy/v1 Eviction per pod, a refusal retried every 5 s).

    python bench/drain.py [--rounds 3] [--load-time 8]     # from the repository root

Starts ``kimik3 dev up --readiness-probes`` (3 GB300 racks of 4 trays; a leader is Ready only
once its simulated engine has loaded, ``--load-time`` s) and, per round, a fresh namespace with 3
TP8 groups (2 trays each, a rack each) and ``disruptionBudget.minAvailable: 2`` (one group may
go); drains the tray of group 0's leader and the tray of group 1's worker at once
(``kimik3_dev.devcluster.drain.measure_drains``), sampling the groups every 0.05 s. Prints and
writes bench/results/drain.json: per round, the most groups down at any sample, the status of
each drain's first eviction, the refusals before the second was granted, when the first group
was back Ready and when the second eviction was granted (s after the drains started).
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

from kimik3.kube import pods as kpods  # noqa: E402
from kimik3_dev.devcluster.cluster import DevCluster, UpOptions  # noqa: E402
from kimik3_dev.devcluster.drain import KUBECTL_RETRY_S, cordon, measure_drains  # noqa: E402
from kimik3_dev.devcluster.racks import RackShape  # noqa: E402
from kimik3_dev.devcluster.rest import Rest  # noqa: E402
from kimik3_dev.devcluster.rollout import cr_path, sample, wait  # noqa: E402
from kimik3_dev.devcluster.workloads import apply_deployment, ensure_namespace  # noqa: E402
from kimik3_dev.benchmark.provenance import checkout_commit  # noqa: E402
from support.recipes import recipe  # noqa: E402

GROUPS, SIZE = 3, 2


def _round(rest: Rest, load_time: float) -> dict:
    ns = f"bench-{uuid.uuid4().hex[:6]}"
    ensure_namespace(rest, ns)
    cr = recipe(name="k3", namespace=ns, replicas=GROUPS, disruptionBudget={"minAvailable": 2})
    cr["metadata"]["annotations"] = {"inference.kimik3.io/sim-load-time": f"{load_time:g}s"}
    apply_deployment(rest, cr)
    ready = lambda: (s := sample(rest, ns, "k3", SIZE)) and len(s) == GROUPS and all(g[3] for g in s)  # noqa: E731
    wait(ready, 180 + 2 * load_time, "3 Ready groups")
    pods = {(int(kpods.group_index(p) or 0), kpods.worker_index(p) or 0): p["spec"]["nodeName"]
            for p in rest.items(f"/api/v1/namespaces/{ns}/pods") if not kpods.is_terminating(p)}
    trays = [pods[(0, 0)], pods[(1, 1)]]
    try:
        drains, samples = measure_drains(rest, ns, "k3", SIZE, trays, timeout_s=180 + 4 * load_time)
    finally:
        for tray in trays:
            cordon(rest, tray, False)
    down = [(at, GROUPS - sum(g[3] for g in s)) for at, s in samples]
    first = min(drains, key=lambda d: (d.attempts[0].status, d.attempts[0].at))
    second = next(d for d in drains if d is not first)
    lost = next(at for at, n in down if n > 0)
    rest.delete(cr_path(ns, "k3"))
    wait(lambda: not rest.items(f"/api/v1/namespaces/{ns}/pods"), 180, f"the pods of {ns} to go")
    rest.delete(f"/api/v1/namespaces/{ns}")
    return {"max_groups_down": max(n for _, n in down),
            "first_evictions": sorted(d.attempts[0].status for d in drains),
            "refusal": next((a.message for d in drains for a in d.attempts if a.status == 429), None),
            "refusals_before_second": sum(a.status == 429 for a in second.attempts),
            "first_granted_s": first.attempts[0].answered, "first_group_lost_s": lost,
            "first_group_back_s": next((at for at, n in down if at > lost and n == 0), None),
            "second_granted_s": second.attempts[-1].answered}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--load-time", type=float, default=8.0, help="simulated load time of a group, s")
    args = parser.parse_args()
    rounds = []
    with tempfile.TemporaryDirectory(prefix="kimik3-bench-drain-") as state:
        cluster = DevCluster(Path(state))
        cluster.up(UpOptions(shape=RackShape(profile="gb300", racks=GROUPS, trays_per_rack=4),
                             readiness_probes=True, load_time=f"{args.load_time:g}s", prometheus=False, kueue=False,
                             die_with_parent=True, wait_timeout_s=180.0))
        try:
            with cluster.api_client() as api:
                for i in range(args.rounds):
                    rounds.append(_round(Rest(api), args.load_time))
                    print(f"round {i + 1}: {rounds[-1]}", flush=True)
        finally:
            cluster.down()
    commit = checkout_commit(REPO)
    out = REPO / "bench" / "results" / "drain.json"
    out.write_text(json.dumps({"measured": time.strftime("%Y-%m-%d"), "commit": commit, "groups": GROUPS,
                               "trays_per_group": SIZE, "groups_that_may_go": 1, "load_time_s": args.load_time,
                               "retry_s": KUBECTL_RETRY_S, "rounds": rounds}, indent=2) + "\n")
    print(f"wrote {out.relative_to(REPO)}")


if __name__ == "__main__":
    main()
