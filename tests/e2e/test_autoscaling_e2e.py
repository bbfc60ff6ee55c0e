"""Decode-latency autoscaling end to end on `kimik3 dev up`: a load step makes the operator add
groups through real Prometheus queries, the per-token latency falls back under the target, and
without load the deployment scales back down after the stabilization window; status, Events
and the operator's metrics tell the story.

Numbers (autoscaler/perfmodel.py, the latency recipe): 2.09 ms per token at batch 1, 4.37 ms at 4,
5.46 ms at 6 and 7.5 ms at 12 requests per group. The target is 7 ms: 12 users on one group are
over it, on two or three groups under it. (A tighter target needs finer ITL buckets than vLLM's
default, whose first bounds 10 / 25 / 50 ms make a DSpark step's P90 coarse: the recipe's
`--custom-histogram-buckets` is the fix on real engines; the simulator serves vLLM's defaults.)
"""

from __future__ import annotations

import asyncio
import threading
import time
import urllib.request

import pytest
import requests

from kimik3_dev.sim.load import Phase, resolve_url, run_load
from support.waiting import wait_for

USERS = 12


@pytest.mark.timeout(900)
def test_load_step_scales_up_through_prometheus_then_back_down(dev_env, ns):
    prom = dev_env.state["urls"]["prometheus"]
    cr = dev_env.deployment(ns)
    cr["spec"]["autoscaling"] = {
        "enabled": True, "minReplicas": 1, "maxReplicas": 3,
        "metricsSource": {"type": "prometheus", "prometheusUrl": prom},
        "target": {"metric": "timePerOutputToken", "percentile": 90, "value": "7ms"},
        "interval": "10s", "window": "30s", "scaleDownStabilization": "60s"}
    cr["spec"]["monitoring"] = {"interval": "5s"}  # the PodMonitor's: ~6 scrapes a window, not the default 2
    dev_env.apply(cr)
    url, model = wait_for(lambda: _answering(dev_env, ns), 180, "the simulated engine's endpoint")

    stop = threading.Event()
    load = threading.Thread(target=lambda: asyncio.run(_load_until(url, model, stop)), daemon=True)
    load.start()
    try:
        # Prometheus (5 s scrapes, the PodMonitor's interval) -> a 30 s window -> a decision every 10 s: more groups.
        scaled = wait_for(lambda: _status_if(dev_env, ns, lambda s: (s.get("desiredReplicas") or 0) >= 2), 180,
                          "a scale-up decision")
        assert scaled["lastScale"]["from"] == 1 and scaled["lastScale"]["to"] >= 2
        assert scaled["lastScale"]["reason"].startswith("ScaleUp")
        assert (scaled["decode"]["metric"], scaled["decode"]["percentile"]) == ("timePerOutputToken", 90)
        assert scaled["decode"]["latencySeconds"] > 0.007  # what the decision saw: over target
        metrics = _conditions(dev_env, ns)["MetricsAvailable"]
        assert metrics["status"] == "True", metrics
        # The new groups are placed (each in a rack of its own), load, and take their share.
        wait_for(lambda: _status_if(
            dev_env, ns, lambda s: (s.get("readyReplicas") or 0) >= scaled["desiredReplicas"]), 180,
            "the new groups to be ready")
        settled = wait_for(lambda: _status_if(
            dev_env, ns, lambda s: (s.get("decode") or {}).get("latencySeconds", 1) <= 0.007
            and (s.get("readyReplicas") or 0) >= 2), 240, "P90 per-token latency back under 7 ms")
        assert settled["decode"]["tokensPerSecondPerUser"] >= 1 / 0.007
    finally:
        stop.set()
        load.join(120)
    # No traffic: after the 60 s scale-down window the deployment returns to minReplicas.
    down = wait_for(lambda: _status_if(dev_env, ns, lambda s: s.get("desiredReplicas") == 1), 300, "the scale-down")
    assert down["lastScale"]["to"] == 1 and down["lastScale"]["reason"].startswith("ScaleDown")
    reasons = [e.get("reason", "") for e in dev_env.events(ns)]
    assert any(r.startswith("ScaleUp") for r in reasons) and "ScaleDown" in reasons, reasons
    operator_metrics = urllib.request.urlopen(f"{dev_env.state['urls']['operator']}/metrics", timeout=10).read().decode()
    assert f'kimik3_autoscaler_desired_groups{{deployment="k3",namespace="{ns}"}} 1.0' in operator_metrics


def _answering(dev_env, ns):
    try:
        url, model = resolve_url(dev_env.cluster.kubeconfig, dev_env.cluster.state_dir, "k3", ns)
        return (url, model) if requests.get(f"{url}/health", timeout=2).status_code == 200 else None
    except Exception:  # noqa: BLE001 - not there yet
        return None


def _conditions(dev_env, ns):
    return {c["type"]: c for c in (dev_env.get_cr(ns) or {}).get("status", {}).get("conditions", [])}


def _status_if(dev_env, ns, predicate):
    status = (dev_env.get_cr(ns) or {}).get("status") or {}
    return status if predicate(status) else None


async def _load_until(url: str, model: str | None, stop: threading.Event) -> None:
    """USERS closed-loop users, in 20 s phases, until ``stop`` is set (bounded: 15 minutes)."""
    deadline = time.monotonic() + 900
    while not stop.is_set() and time.monotonic() < deadline:
        await run_load(url, [Phase(20.0, concurrency=USERS, prompt_tokens=256, output_tokens=200)], model=model,
                       drain_s=5.0)
