"""The operator of this suite runs as the chart's ServiceAccount, with the chart's RBAC and nothing
more: the identity's objects are the ones ``helm template`` renders, the API server authenticates
its token as ``system:serviceaccount:kimik3-system:kimik3-operator`` (the ServiceAccount's own UID,
a TokenRequest credential), refuses it what the chart does not grant, and the audit log shows
the operator's writes made with that token."""

from __future__ import annotations

import datetime as dt

import pytest
from kubernetes import config

from kimik3.controller.kube import ApiError, Kube
from kimik3_dev.devcluster.controlplane import ADMIN_USER, OPERATOR_USER
from kimik3_dev.devcluster.rbac import (RELEASE, RELEASE_NAMESPACE, TOKEN_LIFETIME_S, HelmMissingError, chart_rbac,
                                   helm_binary, whoami)
from kimik3_dev.versions import HELM_VERSION
from kimik3.kube.times import parse_rfc3339
from chaos.helpers import apply_converged, assert_operator_wrote_as, operator_in, writers
from support.cluster import metric, metric_samples
from support.rendering import launcher_name

RBAC = "/apis/rbac.authorization.k8s.io/v1"


def test_identity_is_the_chart_service_account_with_exactly_the_rendered_rbac(admin_api, operator_identity):
    assert operator_identity.user == OPERATOR_USER == "system:serviceaccount:kimik3-system:kimik3-operator"
    assert operator_identity.objects == ("ServiceAccount/kimik3-system/kimik3-operator",
                                         "ClusterRole/kimik3-operator", "ClusterRoleBinding/kimik3-operator",
                                         "Role/kimik3-system/kimik3-operator-leader-election",
                                         "Role/kimik3-system/kimik3-operator-wake",
                                         "RoleBinding/kimik3-system/kimik3-operator-leader-election",
                                         "RoleBinding/kimik3-system/kimik3-operator-wake")
    rendered = {d["kind"]: d for d in chart_rbac()}
    role = Kube(admin_api).request("GET", f"{RBAC}/clusterroles/{RELEASE}")
    assert role["rules"] == rendered["ClusterRole"]["rules"]
    assert not any("*" in r["verbs"] + r["resources"] + r["apiGroups"] for r in role["rules"])
    binding = Kube(admin_api).request("GET", f"{RBAC}/clusterrolebindings/{RELEASE}")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": RELEASE}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": RELEASE, "namespace": RELEASE_NAMESPACE}]
    sa = Kube(admin_api).request("GET", f"/api/v1/namespaces/{RELEASE_NAMESPACE}/serviceaccounts/{RELEASE}")
    assert sa["metadata"]["uid"] == operator_identity.uid

    expires = parse_rfc3339(operator_identity.expires)
    left_s = (expires - dt.datetime.now(dt.timezone.utc)).total_seconds()
    assert TOKEN_LIFETIME_S - 3600 < left_s <= TOKEN_LIFETIME_S + 60, left_s

    with config.new_client_from_config(config_file=str(operator_identity.kubeconfig)) as api:
        me = whoami(api)
        assert me["username"] == OPERATOR_USER
        assert me["uid"] == sa["metadata"]["uid"]  # a real ServiceAccount token, not a static one
        assert set(me["groups"]) == {"system:serviceaccounts", "system:serviceaccounts:kimik3-system",
                                     "system:authenticated"}
        assert me["extra"]["authentication.kubernetes.io/credential-id"][0].startswith("JTI=")
        for method, path, body in [
            ("GET", f"/api/v1/namespaces/{RELEASE_NAMESPACE}/secrets", None),  # never reads Secrets
            ("DELETE", "/api/v1/nodes/kimik3-any-node", None),  # lists nodes (free trays), never writes them
            ("POST", f"/api/v1/namespaces/{RELEASE_NAMESPACE}/pods",
             {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"},
              "spec": {"containers": [{"name": "x", "image": "x"}]}}),
            ("DELETE", f"{RBAC}/clusterroles/{RELEASE}", None),  # cannot widen or drop its own RBAC
        ]:
            with pytest.raises(ApiError) as refused:
                Kube(api).request(method, path, body)
            assert refused.value.status == 403, (method, path, refused.value.body)
            assert OPERATOR_USER in refused.value.body


def test_operator_reconciles_with_the_chart_service_account_token(chaos_cp, kube, namespace, operator_identity):
    with operator_in(operator_identity, namespace) as op:
        before = metric_samples(op.health_url)
        state = apply_converged(kube, namespace, "k3-id", replicas=2)
        assert state["cr"]["status"]["observedGeneration"] == 1
        for api_version, kind, name in [("v1", "ConfigMap", launcher_name(state["cr"])), ("v1", "Service", "k3-id"),
                                        ("resource.nvidia.com/v1beta1", "ComputeDomain", "k3-id"),
                                        ("monitoring.coreos.com/v1", "PodMonitor", "k3-id")]:
            obj = kube.get(api_version, kind, namespace, name)
            assert obj is not None, f"{kind} {name} not applied"
            assert any(m["manager"] == "kimik3-operator" for m in obj["metadata"]["managedFields"]), kind
        # The registry is this process's: compare the delta.
        assert metric(metric_samples(op.health_url), "kimik3_reconciles_total", result="error") == \
            metric(before, "kimik3_reconciles_total", result="error")
    assert_operator_wrote_as(operator_identity, chaos_cp, namespace)
    # The test applied the CR as admin: the audit log tells the two identities apart.
    assert set(writers(chaos_cp, namespace)["kimik3deployments"]) == {ADMIN_USER, OPERATOR_USER}


def test_without_helm_the_error_names_the_build_command(tmp_path):
    with pytest.raises(HelmMissingError) as missing:
        helm_binary(tmp_path)
    assert str(tmp_path / f"helm-{HELM_VERSION}") in str(missing.value)
    assert "tools/build-binaries.sh helm" in str(missing.value)
