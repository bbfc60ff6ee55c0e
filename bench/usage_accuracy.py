#!/usr/bin/env python3
"""Issue 28's accuracy check at full length: the bill against what happened, over ``--minutes`` of load.

    python bench/usage_accuracy.py [--minutes 30] [--users 4]     # from the repository root

Starts ``kimik3 dev up`` (3 GB300 racks of 2 trays, Prometheus from the real Prometheus Operator
with the chart's usage rules, no Kueue) and runs ``kimik3_dev.devcluster.usagecheck.run``: 2 TP8
groups under closed-loop load for ``--minutes``, with an engine restart at a quarter of it, a
Prometheus restart at half and a scale-down to 1 group at three quarters; then ``kimik3 usage
--rolling --hours 1 --format json`` against the engine simulator's own counts (tokens, requests)
and the integral of the GPUs held from a watch of the API server's pods (GPU-hours held). Prints
each figure, its truth and the error, and writes bench/results/usage-accuracy.json (date, commit,
the figures, each check's error in percent, the events' times). Exits 1 when a check is off by
more than 1 %. ``tests/e2e/test_e2e_usage_accuracy.py`` runs the same check for 2 minutes in CI.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import tempfile
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "operator"))
sys.path.insert(0, str(REPO / "tests"))

from kimik3_dev.benchmark.provenance import checkout_commit  # noqa: E402
from kimik3_dev.devcluster import usagecheck  # noqa: E402
from kimik3_dev.devcluster.cluster import DevCluster, UpOptions  # noqa: E402
from kimik3_dev.devcluster.racks import RackShape  # noqa: E402
from kimik3_dev.devcluster.rest import Rest  # noqa: E402
from kimik3_dev.devcluster.workloads import ensure_namespace  # noqa: E402
from support.recipes import recipe  # noqa: E402

RESULTS = REPO / "bench" / "results" / "usage-accuracy.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0, help="length of the load, minutes")
    parser.add_argument("--users", type=int, default=4, help="closed-loop users")
    args = parser.parse_args()
    started = dt.datetime.now(dt.timezone.utc)
    with tempfile.TemporaryDirectory(prefix="kimik3-bench-usage-") as state:
        cluster = DevCluster(Path(state))
        cluster.up(UpOptions(shape=RackShape(profile="gb300", racks=3, trays_per_rack=2), kueue=False,
                             die_with_parent=True, wait_timeout_s=180.0))
        try:
            with cluster.api_client() as api:
                rest = Rest(api)
                ns = f"bench-{uuid.uuid4().hex[:6]}"
                ensure_namespace(rest, ns)
                result = usagecheck.run(cluster, rest, recipe(name=usagecheck.NAME, namespace=ns), args.minutes,
                                        users=args.users)
        finally:
            cluster.down()
    print(f"\n{'figure':<22} {'report':>12} {'truth':>12} {'error %':>8}")
    for column, check in result["checks"].items():
        print(f"{column:<22} {check['report']:>12} {check['truth']:>12} {str(check['error_pct']):>8}")
    failed = usagecheck.failures(result)
    RESULTS.write_text(json.dumps({"date": started.strftime("%Y-%m-%d"), "started": started.strftime("%H:%M:%SZ"),
                                   "commit": checkout_commit(REPO), "args": vars(args), "passed": not failed,
                                   "failures": failed, **result}, indent=2) + "\n")
    print(f"wrote {RESULTS.relative_to(REPO)}")
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
