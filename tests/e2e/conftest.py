"""The dev cluster (``kimik3 dev up``) once per test session, brought down at the end.

Shape: 3 GB300 racks x 4 trays (12 kwok nodes, 48 GPUs). Three racks because the operator
asks LeaderWorkerSet for *exclusive* clique placement (annotation
``leaderworkerset.sigs.k8s.io/exclusive-topology: nvidia.com/gpu.clique``): each group gets a
rack to itself, so 3 groups need 3 racks and a 4th group is the one no rack can hold. Four
trays fit the TP16 shape (4 trays per group) of failure case F14.

Every test gets its own namespace (``ns``), deleted afterwards; deleting it waits until its
pods are gone so the next test finds every rack free.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from devenv import SHAPE, DevEnv, dev_cluster

from kimik3_dev.devcluster.cluster import UpOptions
from kimik3_dev.devcluster.racks import RackShape


@pytest.fixture(scope="session")
def dev_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevEnv]:
    """``kimik3 dev up`` (3 racks x 4 GB300 trays) for the session; ``dev down`` at the end."""
    with dev_cluster(tmp_path_factory.mktemp("dev"),
                     UpOptions(shape=RackShape(**SHAPE), die_with_parent=True, wait_timeout_s=180.0)) as env:
        yield env


@pytest.fixture
def ns(dev_env: DevEnv) -> Iterator[str]:
    """A fresh namespace, its deployment's pods gone afterwards (``DevEnv.fresh_namespace``)."""
    with dev_env.fresh_namespace("e2e", 120.0) as name:
        yield name
