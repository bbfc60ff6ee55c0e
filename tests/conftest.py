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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Worker groups for ``pytest-xdist --dist loadgroup`` (tools/test): every test of a module
    runs on one worker (module fixtures start once), and so do all the modules on the session's
    dev cluster (``dev_env``: one ``dev up`` per run). Package and session control planes start
    once per worker that needs them (seconds). The two workers overlap what waits (loads, Lease
    expiries, cuts) with what computes."""
    root = Path(__file__).parent
    for item in items:
        shared = "dev_env" in getattr(item, "fixturenames", ())
        item.add_marker(pytest.mark.xdist_group("e2e-dev-env" if shared else Path(item.path).relative_to(root).as_posix()))


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
