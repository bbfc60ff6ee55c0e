"""Security: a CR cannot make the operator mount Secrets its author may not read, mount node
paths outside the allowed folders, or create privileged pods; no Secret value reaches the
operator's logs, Events or status."""

from __future__ import annotations

import copy
import json
import logging
import uuid
from collections.abc import Iterator

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kimik3.admission import AdmissionPolicy, admit
from kimik3.api.errors import SpecErrors
from kimik3.controller.kube import Kube
from support.cluster import launcher_configmap, reconciled
from support.recipes import recipe
from support.rendering import render_cr

CR_PATH = ("inference.kimik3.io", "v1alpha1", "kimik3deployments")


@pytest.fixture
def tenant(control_plane, namespace) -> Iterator[client.ApiClient]:
    """User alice: may manage KimiK3Deployments in the namespace, may not read its Secrets."""
    with control_plane.api_client("admin") as admin:
        rbac = client.RbacAuthorizationV1Api(admin)
        rbac.create_namespaced_role(namespace, {"metadata": {"name": "k3-author"}, "rules": [
            {"apiGroups": ["inference.kimik3.io"], "resources": ["kimik3deployments"],
             "verbs": ["get", "list", "create", "update", "patch", "delete"]}]})
        rbac.create_namespaced_role_binding(namespace, {
            "metadata": {"name": "alice-k3-author"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "k3-author"},
            "subjects": [{"kind": "User", "name": "alice", "apiGroup": "rbac.authorization.k8s.io"}]})
        client.CoreV1Api(admin).create_namespaced_secret(namespace, {
            "metadata": {"name": "hf-token"}, "stringData": {"token": "hf_secret_value"}})
    api = control_plane.api_client("admin")
    api.set_default_header("Impersonate-User", "alice")
    yield api
    api.close()


def hub_cr(namespace: str, secret: str = "hf-token") -> dict:
    body = recipe(name="k3-hub", namespace=namespace)
    body["spec"]["model"]["source"] = {"hub": {"tokenSecret": {"name": secret, "key": "token"}}}
    return body


def test_a_tenant_cannot_reference_a_secret_it_may_not_read(tenant, admin_api, namespace):
    objects = client.CustomObjectsApi(tenant)
    with pytest.raises(ApiException) as err:
        objects.create_namespaced_custom_object(*CR_PATH[:2], namespace, CR_PATH[2], hub_cr(namespace))
    assert err.value.status in (403, 422), err.value.body
    message = json.loads(err.value.body)["message"]
    assert "spec.model.source.hub.tokenSecret: you may not get Secret hf-token" in message
    # Once the Secret's owner lets alice read it, the same CR is admitted.
    rbac = client.RbacAuthorizationV1Api(admin_api)
    rbac.create_namespaced_role(namespace, {"metadata": {"name": "read-hf-token"}, "rules": [
        {"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["hf-token"], "verbs": ["get"]}]})
    rbac.create_namespaced_role_binding(namespace, {
        "metadata": {"name": "alice-read-hf-token"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "read-hf-token"},
        "subjects": [{"kind": "User", "name": "alice", "apiGroup": "rbac.authorization.k8s.io"}]})
    created = objects.create_namespaced_custom_object(*CR_PATH[:2], namespace, CR_PATH[2], hub_cr(namespace))
    assert created["spec"]["model"]["source"]["hub"]["tokenSecret"]["name"] == "hf-token"


def test_a_tenant_without_secret_references_is_unaffected(tenant, namespace):
    body = recipe("gb300-tp8-megakernel-dspark.yaml")
    body["metadata"] = {"name": "k3-pvc", "namespace": namespace}
    created = client.CustomObjectsApi(tenant).create_namespaced_custom_object(*CR_PATH[:2], namespace, CR_PATH[2], body)
    assert created["metadata"]["name"] == "k3-pvc"


def test_secret_values_never_reach_logs_events_or_status(operator, admin_api, namespace, caplog):
    value = f"hf_{uuid.uuid4().hex}"
    client.CoreV1Api(admin_api).create_namespaced_secret(namespace, {
        "metadata": {"name": "hf-token"}, "stringData": {"token": value}})
    kube = Kube(admin_api)
    caplog.set_level(logging.DEBUG)
    kube.apply(hub_cr(namespace), force=False)
    obj = reconciled(kube, namespace, "k3-hub")
    lws = kube.get("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", namespace, "k3-hub-engine")
    env = lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0]["env"]
    assert {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token"}}} in env
    events = client.CoreV1Api(admin_api).list_namespaced_event(namespace).items
    haystack = json.dumps(obj) + json.dumps(lws) + "".join(e.message or "" for e in events) + caplog.text
    haystack += json.dumps(launcher_configmap(kube, namespace, "k3-hub"))
    assert value not in haystack


@pytest.mark.parametrize("path,ok", [("/models/kimi-k3", True), ("/raid/weights", True), ("/mnt", True),
                                     ("/", False), ("/etc", False), ("/var/run/docker.sock", False),
                                     ("/models/../etc", False), ("/modelsX", False)])
def test_host_paths_outside_the_allowed_folders_are_refused(path, ok):
    spec = copy.deepcopy(recipe("gb300-dep16-throughput.yaml")["spec"])  # no drafter: a hostPath is offline (F23)
    spec["model"]["source"] = {"hostPath": {"path": path}}
    if ok:
        admit(spec)
        return
    with pytest.raises(SpecErrors) as err:
        admit(spec)
    assert [e.path for e in err.value.errors] == ["spec.model.source.hostPath.path"]
    assert "outside the node folders this cluster allows" in str(err.value)


def test_the_allowed_folders_are_the_platform_teams_choice():
    spec = copy.deepcopy(recipe("gb300-dep16-throughput.yaml")["spec"])
    spec["model"]["source"] = {"hostPath": {"path": "/models/k3"}}
    with pytest.raises(SpecErrors):
        admit(spec, AdmissionPolicy(allowed_host_paths=("/local-nvme",)))
    spec["model"]["source"] = {"hostPath": {"path": "/local-nvme/k3"}}
    admit(spec, AdmissionPolicy(allowed_host_paths=("/local-nvme",)))
    with pytest.raises(SpecErrors, match="none .hostPath is disabled"):
        admit(spec, AdmissionPolicy(allowed_host_paths=()))


def test_engine_pods_are_never_privileged_whatever_the_spec():
    body = recipe("gb300-tp8-megakernel-dspark.yaml")
    body["metadata"].update(namespace="ns", uid="u")
    body["spec"]["engine"]["env"] = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]
    body["spec"]["engine"]["extraArgs"] = ["--max-log-len=10"]
    lws = next(o for o in render_cr(body).objects if o["kind"] == "LeaderWorkerSet")
    for name in ("leaderTemplate", "workerTemplate"):
        pod = lws["spec"]["leaderWorkerTemplate"][name]["spec"]
        assert pod.get("hostNetwork") is None and pod.get("hostPID") is None and pod.get("hostIPC") is None
        for container in pod["containers"]:
            assert container["securityContext"] == {"allowPrivilegeEscalation": False, "privileged": False}
        assert all("hostPath" not in v for v in pod["volumes"])
    assert yaml.safe_dump(lws).count("privileged: true") == 0
