"""A reconciler on a real API server whose pod scrapes all read one stand-in leader, on a clock the
test moves: what the autoscaling and idle controller tests drive step by step."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from kubernetes import client

from kimik3.controller.autoscaling import Autoscaling
from kimik3.controller.kube import Kube
from kimik3.controller.reconcile import Reconciler
from kimik3_dev.devcluster.controlplane import ControlPlane
from support.metrics_server import MetricsServer


@contextmanager
def scraped_reconciler(cp: ControlPlane, prefix: str) -> Iterator[dict[str, Any]]:
    """A fresh namespace ``<prefix>-<8 hex>`` on ``cp`` and a ``Reconciler`` whose autoscaling scrapes
    every pod at one ``MetricsServer`` (``leader``: set its text to what the engines expose) and
    reads the time from ``clock[0]`` (unix seconds, starting at 1,000,000). Yields ``kube``, ``api``
    (admin), ``ns``, ``leader``, ``clock``, ``rec`` and ``cp``."""
    api = cp.api_client("admin")
    ns = f"{prefix}-{uuid.uuid4().hex[:8]}"
    client.CoreV1Api(api).create_namespace({"metadata": {"name": ns}})
    leader = MetricsServer()
    clock = [1_000_000.0]
    kube = Kube(api)
    reconciler = Reconciler(kube, autoscaling=Autoscaling(scrape_url=lambda pod, port: leader.url,
                                                          clock=lambda: clock[0]))
    try:
        yield {"kube": kube, "api": api, "ns": ns, "leader": leader, "clock": clock, "rec": reconciler, "cp": cp}
    finally:
        leader.close()
        api.close()
