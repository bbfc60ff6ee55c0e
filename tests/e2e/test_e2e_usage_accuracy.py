"""Issue 28's done-when on the session's dev cluster, short: the bill against what happened.

``kimik3_dev.devcluster.usagecheck.run`` for ``CI_MINUTES`` of load on 2 TP8 groups with an
engine restart, a Prometheus restart and a scale-down: ``kimik3 usage --rolling`` (the real
command, the recording rules loaded by the real Prometheus Operator) against the engine
simulator's own counts (tokens, requests) and the integral of the GPUs the pods held as a watch
of the API server saw them (GPU-hours held), each within 2 % (``usagecheck.CI_TOLERANCE_PCT``; the
30-minute run, within 1 %). bench/usage_accuracy.py runs the
same for 30 minutes (bench/results/usage-accuracy.json).
"""

from __future__ import annotations

import pytest
from devenv import DevEnv

from kimik3_dev.devcluster import usagecheck
from support.recipes import recipe


@pytest.mark.timeout(600)
def test_usage_report_matches_the_engines_counts_and_the_pod_history(dev_env: DevEnv, ns: str) -> None:
    result = usagecheck.run(dev_env.cluster, dev_env.rest, recipe(name="k3", namespace=ns),
                            usagecheck.CI_MINUTES)
    print("\n" + "\n".join(f"{column}: {check}" for column, check in result["checks"].items()))
    assert [e["event"] for e in result["events"]] == ["engine restart", "Prometheus restart", "scale-down"]
    assert result["checks"]["generation_tokens"]["truth"] > 0 and result["checks"]["gpu_hours_held"]["truth"] > 0
    assert not usagecheck.failures(result, usagecheck.CI_TOLERANCE_PCT), usagecheck.failures(result)
