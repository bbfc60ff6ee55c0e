"""Shared fixtures: one real etcd + kube-apiserver per test session (see kimik3_dev.devcluster).

``admin_api`` is the one client the API-server fixtures below build on: the chaos and chart suites
override it (tests/chaos/conftest.py, tests/chart/conftest.py) with an admin client of their own
control plane, and their tests then get ``kube`` and ``namespace`` on that control plane."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from kimik3.controller.kube import Kube
from kimik3_dev.devcluster.controlplane import ControlPlane
from kimik3_dev.devcluster.install import install_apis
from kimik3_dev.devcluster.operator_thread import OperatorThread
from support.cluster import fresh_namespace


SHARED_DIRS = ("chaos", "chart", "conformance", "e2e")
"""Test folders whose tests share clusters or engines by fixtures wider than a module (the chaos
control plane, the chart's, the real vLLM servers, the dev cluster): each runs whole on one worker."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Worker groups for ``pytest-xdist --dist loadgroup`` (tools/test): a folder of
    ``SHARED_DIRS`` is one group, any other module its own, so that no cluster or module fixture
    is started twice and the two workers overlap what waits (loads, leases, cuts) with what computes."""
    root = Path(__file__).parent
    for item in items:
        rel = Path(item.path).relative_to(root)
        group = rel.parts[0] if rel.parts[0] in SHARED_DIRS else rel.as_posix()
        item.add_marker(pytest.mark.xdist_group(group))


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """A started ControlPlane with the third-party CRDs, the project's own CRDs Established and
    its admission policy installed (``crds/``)."""
    with ControlPlane(tmp_path_factory.mktemp("control-plane")) as cp:
        install_apis(cp)
        yield cp


@pytest.fixture(scope="session")
def admin_api(control_plane: ControlPlane) -> Iterator[client.ApiClient]:
    """ApiClient authenticated as the admin user (group system:masters)."""
    with control_plane.api_client("admin") as api:
        yield api


@pytest.fixture(scope="session")
def operator_api(control_plane: ControlPlane) -> Iterator[client.ApiClient]:
    """ApiClient authenticated with the operator's service-account token (only the RBAC you grant)."""
    with control_plane.api_client("operator") as api:
        yield api


@pytest.fixture
def namespace(admin_api: client.ApiClient) -> Iterator[str]:
    """A fresh namespace, deleted afterwards (it stays Terminating: no namespace controller runs)."""
    with fresh_namespace(admin_api) as name:
        yield name


@pytest.fixture(scope="module")
def operator(control_plane: ControlPlane) -> Iterator[OperatorThread]:
    """The operator (kopf, cluster-wide, admin identity) running in a thread for one test module.

    Module-scoped, not session-scoped: a cluster-wide operator left running would also reconcile
    the CRs of later modules that drive a ``Reconciler`` themselves (it raced
    tests/test_weights_gate.py to create the stager Jobs with its own image)."""
    with OperatorThread(str(control_plane.admin_kubeconfig)) as op:
        yield op


@pytest.fixture
def kube(admin_api: client.ApiClient) -> Kube:
    """The operator's own API wrapper, as admin (of whichever control plane ``admin_api`` is)."""
    return Kube(admin_api)
