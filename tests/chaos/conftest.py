"""Fixtures of the fault-injection suite: a control plane of its own (etcd compaction every 10 s
and no watch cache, so a watch resumed from an old resourceVersion gets 410 Gone; an audit log of
the operator's writes) and the operator's identity (the chart's ServiceAccount and RBAC, a
TokenRequest token: ``operator_identity.kubeconfig``; the operator under test never runs as admin).

``admin_api`` is overridden here with the admin of ``chaos_cp``, so the ``kube`` and ``namespace``
fixtures of tests/conftest.py work on this suite's control plane. What the tests check beyond
tests/support is in ``tests/chaos/helpers.py``.

Run: ``tools/test tests/chaos -q`` (add ``-s`` to see the measured recovery times); ~3.5 min."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kubernetes import client

from kimik3.api.documents import dump_yaml
from kimik3_dev.devcluster.controlplane import ControlPlane
from kimik3_dev.devcluster.install import install_apis
from kimik3_dev.devcluster.rbac import RELEASE_NAMESPACE, OperatorIdentity, install_operator_identity
from support.cluster import serving_control_plane

COMPACTION_INTERVAL = "10s"
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1", "kind": "Policy", "omitStages": ["RequestReceived"],
    "rules": [
        # Who writes KimiK3Deployments (and their status) and LeaderWorkerSets: the test as admin,
        # the operator as the chart's ServiceAccount. Nothing else is logged (the suite is busy).
        {"level": "Metadata", "verbs": ["create", "patch", "update", "delete"],
         "resources": [{"group": "inference.kimik3.io", "resources": ["kimik3deployments", "kimik3deployments/status"]},
                       {"group": "leaderworkerset.x-k8s.io", "resources": ["leaderworkersets"]}]},
        # The operator's Lease with its request body (holder, duration): who held it when.
        {"level": "Request", "verbs": ["create", "update"], "namespaces": [RELEASE_NAMESPACE],
         "resources": [{"group": "coordination.k8s.io", "resources": ["leases"]}]},
        {"level": "None"},
    ],
}


@pytest.fixture(scope="package")
def chaos_cp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    state = tmp_path_factory.mktemp("chaos-cp")
    audit = state / "audit"
    audit.mkdir()
    (audit / "policy.yaml").write_text(dump_yaml(AUDIT_POLICY))
    with serving_control_plane(state, install_apis, extra_apiserver_args=[
            f"--etcd-compaction-interval={COMPACTION_INTERVAL}",
            "--watch-cache=false",  # watches straight from etcd: a compacted resourceVersion is a 410
            f"--audit-policy-file={audit / 'policy.yaml'}",
            f"--audit-log-path={audit / 'audit.log'}"]) as cp:
        yield cp


@pytest.fixture(scope="package")
def admin_api(chaos_cp: ControlPlane) -> Iterator[client.ApiClient]:
    """The admin of ``chaos_cp`` (overrides the session's: ``kube`` and ``namespace`` follow)."""
    with chaos_cp.api_client("admin") as api:
        yield api


@pytest.fixture(scope="package")
def operator_identity(admin_api: client.ApiClient, tmp_path_factory: pytest.TempPathFactory) -> OperatorIdentity:
    """The chart's ServiceAccount and RBAC (``helm template``), installed once; a 24 h token."""
    return install_operator_identity(admin_api, tmp_path_factory.mktemp("operator-identity") / "operator.kubeconfig")
