"""A scratch dev cluster serving one KimiK3Deployment, for a benchmark that measures around it
(bench/gateway.py, bench/routing.py): brought up in a temporary directory, torn down afterwards.

``recipe_deployment(recipe, namespace, groups)`` reads a recipe as the deployment ``k3`` of
``groups`` replicas whose simulated engines load in 1 s; ``serving_cluster(cr, groups, ...)`` brings
up one GB300 rack of 2 trays per group (one TP8 group each, no Prometheus), applies ``cr`` and
yields once its groups are Ready and its Service answers.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from kimik3_dev.devcluster.cluster import DevCluster, UpOptions
from kimik3_dev.devcluster.racks import RackShape
from kimik3_dev.devcluster.rest import Rest
from kimik3_dev.devcluster.rollout import serving
from kimik3_dev.devcluster.workloads import apply_deployment

NAME = "k3"
"""The deployment's name (``recipe_deployment``)."""
TRAYS_PER_GROUP = 2
"""Trays (pods) per group: one GB300 rack of 2 trays holds one TP8 group."""


def recipe_deployment(recipe: Path, namespace: str, groups: int) -> dict[str, Any]:
    """The KimiK3Deployment of the YAML file ``recipe`` as ``namespace``/``k3`` with ``groups``
    replicas, its simulated engines loading the model in 1 s (``inference.kimik3.io/sim-load-time``)."""
    cr = yaml.safe_load(recipe.read_text())
    cr["metadata"] = {"name": NAME, "namespace": namespace, "annotations": {"inference.kimik3.io/sim-load-time": "1s"}}
    cr["spec"]["replicas"] = groups
    return cr


@dataclass(frozen=True)
class Serving:
    """A scratch cluster serving one deployment: the cluster, an admin ``Rest`` on it, the URL of
    the deployment's Service stand-in and the model it serves (None: the engines' default)."""

    cluster: DevCluster
    rest: Rest
    url: str
    model: str | None


@contextmanager
def serving_cluster(cr: dict[str, Any], groups: int, timeout_s: float, prefix: str) -> Iterator[Serving]:
    """A dev cluster in a temporary directory named ``prefix``...: ``groups`` GB300 racks of 2
    trays, no Prometheus, stopped with this process (``die_with_parent``), up within ``timeout_s``
    s; the KimiK3Deployment ``cr`` applied and waited for (``rollout.serving``, ``timeout_s`` s)
    until ``groups`` groups of 2 pods are Ready and its Service answers; down afterwards."""
    meta = cr["metadata"]
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        cluster = DevCluster(Path(tmp) / "dev")
        cluster.up(UpOptions(shape=RackShape(profile="gb300", racks=groups, trays_per_rack=TRAYS_PER_GROUP),
                             prometheus=False, die_with_parent=True, wait_timeout_s=timeout_s))
        try:
            with cluster.api_client() as api:
                rest = Rest(api)
                apply_deployment(rest, cr)  # creates the namespace first
                url, model = serving(rest, cluster.state_dir, meta["namespace"], meta["name"], groups,
                                     TRAYS_PER_GROUP, timeout_s)
                yield Serving(cluster, rest, url, model)
        finally:
            cluster.down()
