"""The shipped Grafana dashboard (charts/kimik3-operator/files/dashboards/kimik3.json) on live series.

A deployment that exercises every panel runs on the session's dev cluster: placed by Kueue (the
Kueue panels), autoscaled through the dev Prometheus (the autoscaler panels), DSpark on (the
speculative-decoding panels), and an engine change baked on a canary group (the rollout panels:
two revisions, canary checks). While the kit's load generator (``kimik3 dev load``'s
``kimik3_dev.sim.load``) runs on its endpoint, every query of every panel goes to the dev
Prometheus as Grafana would send it (``support.grafana``: variables resolved against Prometheus,
the test's namespace and deployment picked, ``$__rate_interval`` and the rest substituted), and the
test fails on a variable that offers nothing, a query that returns no series, or series that lack a
label the query's legend renders.
"""

from __future__ import annotations

import json
import time

import pytest
from devenv import DevEnv

from kimik3_dev.devcluster import kueue
from kimik3_dev.devcluster.rollout import Load, serving
from kimik3_dev.sim.load import summarize
from support.grafana import Dashboard, Prometheus, problems_of, targets
from support.recipes import REPO
from support.waiting import wait_for

DASHBOARD = REPO / "charts" / "kimik3-operator" / "files" / "dashboards" / "kimik3.json"
WAIT_S = 120.0
SERIES_S = 90.0
"""Bound on the wait for every panel's series once the canary has been checked, seconds: a new
series needs two scrapes (5 s apart) inside ``$__rate_interval`` before rate() returns it."""


def _canary_checked(env: DevEnv, ns: str) -> dict | None:
    canary = ((env.get_cr(ns) or {}).get("status") or {}).get("rollout", {}).get("canary") or {}
    return canary if canary.get("checks", 0) >= 1 else None


@pytest.mark.timeout(600)
def test_every_panel_query_returns_series_with_its_legend_labels(dev_env: DevEnv, ns: str) -> None:
    prometheus_url = dev_env.state["urls"]["prometheus"]
    local_queue = kueue.local_queue(ns)
    dev_env.rest.apply(kueue.object_path(local_queue), local_queue)
    cr = dev_env.deployment(ns, replicas=1)
    cr["metadata"]["annotations"] = {"inference.kimik3.io/sim-load-time": "1s"}  # simulator-only override
    cr["spec"].setdefault("scheduling", {})["placement"] = {"mode": "kueue",
                                                            "queueName": local_queue["metadata"]["name"]}
    cr["spec"]["autoscaling"] = {
        "enabled": True, "minReplicas": 1, "maxReplicas": 1, "interval": "10s", "window": "30s",
        "metricsSource": {"type": "prometheus", "prometheusUrl": prometheus_url},
        "target": {"metric": "timePerOutputToken", "percentile": 90, "value": "50ms"}}
    cr["spec"]["rollout"] = {"canary": {"groups": 1, "bake": "10m", "analysis": {"interval": "10s"}}}
    cr["spec"]["monitoring"] = {"interval": "5s"}  # the PodMonitor's: 2 scrapes a 10 s check window, not 0-1
    dev_env.apply(cr)
    url, model = serving(dev_env.rest, dev_env.cluster.state_dir, ns, "k3", 1, 2, WAIT_S)

    prometheus = Prometheus(prometheus_url)
    model_json = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    scrape_s = prometheus.scrape_interval_s()
    found: list[str] = []

    def clean() -> bool:
        """Every query right now (the dashboard opened anew); its problems kept in ``found``."""
        dashboard = Dashboard(model_json, prometheus, scrape_s)
        values, out = dashboard.variables({"namespace": ns, "deployment": "k3"})
        for target in targets(model_json):
            expr, result = dashboard.run(target, values)
            out += [f"{p}\n    {expr}" for p in problems_of(target, result)]
        found[:] = out
        return not out

    with Load(url, model, users=4) as load:
        # an engine change: a canary group of the new revision bakes beside the old group
        dev_env.rest.call("PATCH", dev_env.cr_path(ns), content_type="application/merge-patch+json",
                          body={"spec": {"engine": {"env": [{"name": "KIMIK3_DASHBOARD_TEST", "value": "1"}]}}})
        wait_for(lambda: _canary_checked(dev_env, ns), WAIT_S, "a judged check of the canary analysis")
        started = time.monotonic()
        try:
            wait_for(clean, SERIES_S, "every panel's series", interval=5.0)
        except AssertionError:
            pytest.fail(f"{len(found)} problem(s) with the dashboard's queries after {time.monotonic() - started:.0f} s "
                        "of series:\n" + "\n".join(found), pytrace=False)
    total = summarize(load.results)["total"]
    assert total["errors"] == 0, total
    queries = sum(1 for _ in targets(model_json))
    print(f"\n{queries} queries of {DASHBOARD.name} returned series with their legend labels "
          f"({time.monotonic() - started:.0f} s after the first canary check; {total['requests']} requests)")
