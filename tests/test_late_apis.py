"""A child kind whose CRD is installed after the operator started is watched within seconds
(controller/lateapis.py): a deleted HTTPRoute comes back by its watch, not by the 120 s resync.

kopf never re-reads discovery by itself (``settings.scanning.disabled``, in both install modes),
so without ``watch_late_apis`` the heal waits for the resync: these tests fail then.
"""

from __future__ import annotations

import time

import pytest
import requests
from prometheus_client import REGISTRY

from kimik3.controller.lateapis import PERIOD_S
from kimik3.controller.steps import RESYNC_STARTING_S
from kimik3.controller.kube import Kube
from kimik3.kube.kinds import HTTP_ROUTE, KIMIK3_DEPLOYMENT
from kimik3_dev.devcluster.controlplane import ControlPlane
from kimik3_dev.devcluster.install import own_manifests
from kimik3_dev.devcluster.operator_thread import OperatorThread
from kimik3_dev.devcluster.thirdparty import thirdparty_crd_paths
from support.cluster import apply, delete_crd, fresh_namespace, reconciled, without_crd
from support.recipes import recipe
from support.waiting import wait_for

HEAL_S = 4 * PERIOD_S
"""A deleted HTTPRoute is back this soon: a discovery look-up, a watch start, one reconcile."""


@pytest.fixture
def without_httproute_crd(control_plane, admin_api):
    with without_crd(control_plane, admin_api, HTTP_ROUTE):
        yield


def test_httproute_crd_installed_after_the_operator_is_watched(control_plane, kube, namespace,
                                                               without_httproute_crd):
    assert HEAL_S < RESYNC_STARTING_S / 4
    with OperatorThread(str(control_plane.admin_kubeconfig), namespaces=[namespace]):
        cr = recipe(name="k3-route", service={"httpRoute": {"parentRefs": [{"name": "gw"}]}})
        apply(kube, cr, namespace)
        reconciled(kube, namespace, "k3-route")  # the HTTPRoute apply fails (no such kind) and is retried
        control_plane.apply_crds([thirdparty_crd_paths()["HTTPRoute"]])
        route = wait_for(lambda: kube.get(*HTTP_ROUTE.type_meta, namespace, "k3-route"), 30,
                         "the HTTPRoute once its CRD is installed (the apply is retried with back-off)")
        kube.delete(*HTTP_ROUTE.type_meta, namespace, "k3-route")
        healed = wait_for(lambda: (r := kube.get(*HTTP_ROUTE.type_meta, namespace, "k3-route")) and
                          r["metadata"]["uid"] != route["metadata"]["uid"] and r, HEAL_S,
                          "the deleted HTTPRoute recreated by its watch")
        assert [p["name"] for p in healed["spec"]["parentRefs"]] == ["gw"]



def test_cluster_wide_a_reinstalled_crds_child_is_applied_at_once_not_at_the_next_retry(
        control_plane, kube, namespace, without_httproute_crd):
    """Cluster-wide too the kind is resolved by the operator's look-up, which drops its cache of
    the kind and reconciles at once (the trial on dev up saw the HTTPRoute back only at the
    next apply retry, 30-50 s later). Five failed applies put the next retry 16 s away (the work
queue's back-off: 1, 2, 4, 8, 16 s)."""
    def failures() -> float:
        return REGISTRY.get_sample_value("kimik3_apply_errors_total", {"kind": HTTP_ROUTE.kind}) or 0.0

    with OperatorThread(str(control_plane.admin_kubeconfig)):
        before = failures()
        apply(kube, recipe(name="k3-route", service={"httpRoute": {"parentRefs": [{"name": "gw"}]}}), namespace)
        wait_for(lambda: failures() >= before + 5, 40, "five failed HTTPRoute applies (retries 1, 2, 4, 8 s apart)")
        control_plane.apply_crds([thirdparty_crd_paths()["HTTPRoute"]])
        wait_for(lambda: kube.get(*HTTP_ROUTE.type_meta, namespace, "k3-route"), 2 * PERIOD_S,
                 "the HTTPRoute, well before the next retry (16 s after the fifth failure)")


def test_a_watched_kinds_crd_removed_is_waited_out_and_its_children_restored(control_plane, admin_api, kube,
                                                                             namespace, without_httproute_crd):
    """A watched kind's CRD deleted under a running operator: kopf's watch of it gets 404 and, left
    to itself, ends the whole operator (~3 s after the deletion; with kopf's CRD watch on, when it
    reconnected before that watch dropped the kind, as the chart's minimal-RBAC proof did in CI). The watch waits instead (lateapis.tolerate_unserved_kinds), the
    operator stays up and healthy, and once the CRD is back the HTTPRoute the removal took is
    applied again within a few look-ups, not at the next resync."""
    control_plane.apply_crds([thirdparty_crd_paths()["HTTPRoute"]])
    with OperatorThread(str(control_plane.admin_kubeconfig), namespaces=[namespace]) as op:
        apply(kube, recipe(name="k3-route", service={"httpRoute": {"parentRefs": [{"name": "gw"}]}}), namespace)
        route = wait_for(lambda: kube.get(*HTTP_ROUTE.type_meta, namespace, "k3-route"), 30, "the HTTPRoute")
        delete_crd(admin_api, HTTP_ROUTE)
        time.sleep(3 * PERIOD_S)  # the watch meets 404s (without the wait: the operator exited within ~3 s)
        assert (op.running, op.error) == (True, None)
        assert requests.get(f"{op.health_url}/healthz", timeout=5).status_code == 200
        control_plane.apply_crds([thirdparty_crd_paths()["HTTPRoute"]])
        back = wait_for(lambda: kube.get(*HTTP_ROUTE.type_meta, namespace, "k3-route"), 4 * PERIOD_S,
                        "the HTTPRoute applied again once its CRD is served (the watch's next look-up)")
        assert back["metadata"]["uid"] != route["metadata"]["uid"]
        assert [p["name"] for p in back["spec"]["parentRefs"]] == ["gw"]


@pytest.mark.tier("apiserver")  # a ControlPlane of its own
def test_the_kimik3deployment_crd_installed_after_the_operator_is_watched(tmp_path):
    """The operator's own CRD applied after it started (CRDs managed apart from the chart, a GitOps
    ordering): kopf resolves it only at start, so the operator's look-up must cover it too; a CR
    created then is reconciled within a few look-ups, not after a restart. A control plane of its
    own: the session's has this CRD and other modules' CRs."""
    with ControlPlane(tmp_path / "cp") as cp:
        cp.apply_crds(list(thirdparty_crd_paths().values()))
        with OperatorThread(str(cp.admin_kubeconfig)), cp.api_client("admin") as api:
            kube = Kube(api)
            cp.apply_crds(own_manifests()[0])
            with fresh_namespace(api) as namespace:
                apply(kube, recipe(name="k3-late"), namespace)
                cr = wait_for(lambda: (c := kube.get(*KIMIK3_DEPLOYMENT.type_meta, namespace, "k3-late")) and
                              c.get("status", {}).get("observedGeneration") and c, 4 * PERIOD_S,
                              "the CR reconciled (status.observedGeneration) once its CRD is served")
                assert cr["metadata"]["finalizers"]
