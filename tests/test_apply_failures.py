"""A child the API server refuses stops no independent child (``controller.reconcile``): with the
PodMonitor CRD absent the Service, HTTPRoute and LeaderWorkerSet are still applied, and the status names
the API that is not served, who installs it and the spec's way around it; the LeaderWorkerSet,
which needs the ComputeDomain, waits for it (``kube.kinds.CHILD_NEEDS``).

Real API server (the session's control plane, its third-party CRDs), operator in a thread.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kubernetes import client

from kimik3.kube.kinds import COMPUTE_DOMAIN, HTTP_ROUTE, LEADER_WORKER_SET, POD_MONITOR, SERVICE, Kind
from kimik3_dev.devcluster.operator_thread import OperatorThread
from kimik3_dev.devcluster.thirdparty import thirdparty_crd_paths
from support.cluster import apply
from support.recipes import recipe
from support.waiting import wait_for

ROUTE = {"httpRoute": {"parentRefs": [{"name": "gw"}]}}


@pytest.fixture
def without_crd(request: pytest.FixtureRequest, control_plane, admin_api) -> Iterator[Kind]:
    kind: Kind = request.param
    crd = f"{kind.plural}.{kind.group}"
    ext = client.ApiextensionsV1Api(admin_api)
    ext.delete_custom_resource_definition(crd)
    wait_for(lambda: crd not in {c.metadata.name for c in ext.list_custom_resource_definition().items}, 30,
             f"the {kind.kind} CRD deleted")
    yield kind
    if crd not in {c.metadata.name for c in ext.list_custom_resource_definition().items}:
        control_plane.apply_crds([thirdparty_crd_paths()[kind.kind]])


def _degraded(kube, namespace: str, name: str) -> dict | None:
    obj = kube.get("inference.kimik3.io/v1alpha1", "KimiK3Deployment", namespace, name) or {}
    return next((c for c in (obj.get("status") or {}).get("conditions") or []
                 if c["type"] == "Degraded" and c["reason"] == "ApplyFailed"), None)


@pytest.mark.parametrize("without_crd", [POD_MONITOR], indirect=True)
def test_an_unserved_podmonitor_stops_no_other_child(control_plane, kube, namespace, without_crd):
    with OperatorThread(str(control_plane.admin_kubeconfig), namespaces=[namespace]):
        apply(kube, recipe(name="k3-nopm", service=ROUTE), namespace)
        for kind in (SERVICE, HTTP_ROUTE, LEADER_WORKER_SET):
            wait_for(lambda: kube.get(*kind.type_meta, namespace, f"k3-nopm{'-engine' * (kind == LEADER_WORKER_SET)}"),
                     30, f"the {kind.kind}, applied although the PodMonitor cannot be")
        degraded = wait_for(lambda: _degraded(kube, namespace, "k3-nopm"), 30, "Degraded=True ApplyFailed")
    assert degraded["status"] == "True"
    assert degraded["message"] == (
        "PodMonitor k3-nopm: the API server does not serve monitoring.coreos.com/v1 PodMonitor (404): install "
        "the Prometheus Operator (its PodMonitor CRD), or set spec.monitoring.enabled: false")


@pytest.mark.parametrize("without_crd", [COMPUTE_DOMAIN], indirect=True)
def test_the_leaderworkerset_waits_for_the_computedomain_it_needs(control_plane, kube, namespace, without_crd):
    with OperatorThread(str(control_plane.admin_kubeconfig), namespaces=[namespace]):
        apply(kube, recipe(name="k3-nocd", service=ROUTE), namespace)
        wait_for(lambda: kube.get(*HTTP_ROUTE.type_meta, namespace, "k3-nocd"), 30,
                 "the HTTPRoute, applied after the ComputeDomain failed")
        degraded = wait_for(lambda: _degraded(kube, namespace, "k3-nocd"), 30, "Degraded=True ApplyFailed")
        assert kube.get(*LEADER_WORKER_SET.type_meta, namespace, "k3-nocd-engine") is None
    assert degraded["message"] == (
        "ComputeDomain k3-nocd: the API server does not serve resource.nvidia.com/v1beta1 ComputeDomain (404): "
        "install NVIDIA's DRA driver for GPUs (its ComputeDomain CRD), or run the operator with "
        "--no-compute-domains (chart value computeDomains: false); LeaderWorkerSet k3-nocd-engine: not applied "
        "until the ComputeDomain it needs is")
