"""A child kind whose CRD is installed after the operator started is watched within seconds
(controller/lateapis.py): a deleted HTTPRoute comes back by its watch, not by the 120 s resync.

Namespace-scoped, kopf never re-reads discovery by itself (``settings.scanning.disabled``), so
without ``watch_late_apis`` the heal waits for the resync: this test fails then. Cluster-wide,
kopf's CRD watch usually resolves the kind but can miss it (the race the module docstring names).
"""

from __future__ import annotations

import pytest
from kubernetes import client

from kimik3.controller.lateapis import PERIOD_S
from kimik3.controller.reconcile import RESYNC_STARTING_S
from kimik3.kube.kinds import HTTP_ROUTE
from kimik3_dev.devcluster.operator_thread import OperatorThread
from kimik3_dev.devcluster.thirdparty import thirdparty_crd_paths
from support.cluster import apply, reconciled
from support.recipes import recipe
from support.waiting import wait_for

CRD = f"{HTTP_ROUTE.plural}.{HTTP_ROUTE.group}"
HEAL_S = 4 * PERIOD_S
"""A deleted HTTPRoute is back this soon: a discovery look-up, a watch start, one reconcile."""


@pytest.fixture
def without_httproute_crd(control_plane, admin_api):
    ext = client.ApiextensionsV1Api(admin_api)
    ext.delete_custom_resource_definition(CRD)
    wait_for(lambda: CRD not in {c.metadata.name for c in ext.list_custom_resource_definition().items}, 30,
             "HTTPRoute CRD deleted")
    yield
    if CRD not in {c.metadata.name for c in ext.list_custom_resource_definition().items}:
        control_plane.apply_crds([thirdparty_crd_paths()["HTTPRoute"]])


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

