"""Shared fixtures: one real etcd + kube-apiserver per test session (see kimik3_dev.devcluster),
and the test tiers (``-m unit`` ...: tests/support/tiers.py), given to every test at collection.

``admin_api`` is the one client the API-server fixtures below build on: the chaos and chart suites
override it (tests/chaos/conftest.py, tests/chart/conftest.py) with an admin client of their own
control plane, and their tests then get ``kube`` and ``namespace`` on that control plane."""

from __future__ import annotations

from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from xdist.scheduler import LoadScopeScheduling

from kimik3.controller.kube import Kube
from kimik3.kube.kinds import POD
from kimik3_dev.devcluster import kueue
from kimik3_dev.devcluster.controlplane import ControlPlane
from kimik3_dev.devcluster.install import install_apis
from kimik3_dev.devcluster.operator_thread import OperatorThread
from support import tiers
from support.cluster import fresh_namespace, serving_control_plane


DEV_ENV_SCOPE = "tests/e2e (the session's dev cluster)"
OWN_CLUSTERS = ("tests/e2e/test_e2e_kueue.py", "tests/e2e/test_e2e_rollout.py")
"""The e2e modules that bring up a dev cluster of their own (module fixtures), not ``dev_env``."""


def worker_scope(nodeid: str) -> str:
    """What runs whole on one worker of ``tools/test`` (pytest-xdist): a module (its module
    fixtures start once), except that the e2e modules on the session's dev cluster (``dev_env``:
    one ``dev up`` per run) share one scope. Package and session control planes start once per
    worker that needs them (seconds)."""
    module = nodeid.split("::", 1)[0]
    return DEV_ENV_SCOPE if module.startswith("tests/e2e/") and module not in OWN_CLUSTERS else module


class WorkerScopes(LoadScopeScheduling):
    """xdist's scope scheduling with ``worker_scope``: the workers overlap what waits (loads,
    Lease expiries, cuts) with what computes. (``--dist loadgroup`` marks are not read under
    pytest 9.2: xdist 3.8.0 writes the group into ``item._nodeid``, which pytest 9 no longer has.)"""

    def _split_scope(self, nodeid: str) -> str:
        return worker_scope(nodeid)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> WorkerScopes:
    return WorkerScopes(config, log)


REPO = Path(__file__).resolve().parent.parent


@pytest.hookimpl(tryfirst=True)  # before -m deselects: it selects on the tiers given here
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Each test's one tier marker (tests/support/tiers.py). A test on the session's dev cluster
    outside ``DEV_ENV_SCOPE`` would start a second one on the other worker: refused, naming the module."""
    for item in items:
        module = Path(item.path).relative_to(REPO).as_posix()
        if "dev_env" in getattr(item, "fixturenames", ()) and worker_scope(module) != DEV_ENV_SCOPE:
            raise pytest.UsageError(f"{module} uses dev_env but is in OWN_CLUSTERS of tests/conftest.py: "
                                    "take it out of OWN_CLUSTERS")
    tiers.assign(config, items, REPO)


UNIT_ONLY = pytest.StashKey[bool]()


def pytest_collection_finish(session: pytest.Session) -> None:
    # A run of unit tests only has no cluster thread of an earlier module to spare: guard every thread.
    session.config.stash[UNIT_ONLY] = all(tiers.is_unit(item) for item in session.items)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, None, None]:
    """A unit test's set-up and run start no process (``tiers.ProcessGuard``; not its teardown,
    where a module or session fixture of an earlier, dearer test may stop its processes)."""
    with tiers.guard(item, item.config.stash.get(UNIT_ONLY, False)):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    with tiers.guard(item, item.config.stash.get(UNIT_ONLY, False)):
        return (yield)


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """A started ControlPlane with the third-party CRDs, the project's own CRDs Established and
    its admission policy installed (``crds/``)."""
    with serving_control_plane(tmp_path_factory.mktemp("control-plane"), install_apis) as cp:
        yield cp


@pytest.fixture(scope="module")
def own_control_plane(request: pytest.FixtureRequest,
                      tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """A control plane of the requesting test module's own, set up as ``control_plane`` (every CRD
    and the admission policy), stopped after the module: for tests that drive a ``Reconciler``
    step by step and must meet no other module's operator or objects."""
    with serving_control_plane(tmp_path_factory.mktemp(f"{request.module.__name__}-cp"), install_apis) as cp:
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
def pods_made(kube: Kube, namespace: str) -> Iterator[None]:
    """Deletes the pods a test made in ``namespace`` by hand (no kubelet, namespace controller or
    garbage collector runs on this control plane): a later test on it must not see them (the
    engine simulator's supervisor lists every pod of the cluster)."""
    yield
    for pod in kube.list(*POD.type_meta, namespace, ""):
        kube.delete(*POD.type_meta, namespace, pod["metadata"]["name"])


@pytest.fixture
def kube(admin_api: client.ApiClient) -> Kube:
    """The operator's own API wrapper, as admin (of whichever control plane ``admin_api`` is)."""
    return Kube(admin_api)


@pytest.fixture
def kueue_queue(control_plane: ControlPlane, kube: Kube, namespace: str) -> str:
    """Kueue's API served (the pinned Kueue's CRDs, stored version v1beta2; no manager, no webhook)
    and the LocalQueue ``default`` in ``namespace``, as a tenant's admin makes it (no status: Kueue
    never reports on it here, so it holds no group back, ``controller.queues``). Its name."""
    control_plane.apply_crds(kueue.crd_documents(None))
    kube.apply(kueue.local_queue(namespace))
    return kueue.LOCAL_QUEUE
