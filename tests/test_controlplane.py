"""The real control plane harness: version, third-party CRDs, strict validation, auth, cleanup."""

from __future__ import annotations

import json
import os
import socket
import stat
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kimik3_dev.devcluster.controlplane import (
    OPERATOR_GROUPS,
    OPERATOR_USER,
    ControlPlane,
    ControlPlaneError,
    MissingBinaryError,
    find_binaries,
)
from kimik3_dev.versions import KUBERNETES_VERSION, VLLM_IMAGE

LWS_GROUP, LWS_VERSION, LWS_PLURAL = "leaderworkerset.x-k8s.io", "v1", "leaderworkersets"


def _minimal_lws(name: str) -> dict:
    return {
        "apiVersion": f"{LWS_GROUP}/{LWS_VERSION}",
        "kind": "LeaderWorkerSet",
        "metadata": {"name": name},
        "spec": {
            "leaderWorkerTemplate": {
                "size": 2,
                "workerTemplate": {"spec": {"containers": [{"name": "vllm", "image": VLLM_IMAGE}]}},
            }
        },
    }


def _processes_mentioning(text: str) -> list[int]:
    """PIDs of live processes whose command line contains ``text``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
            status = (entry / "status").read_text()
        except OSError:
            continue
        if text in cmdline and "State:\tZ" not in status:
            found.append(int(entry.name))
    return found


def test_server_reports_built_version(admin_api: client.ApiClient) -> None:
    info = client.VersionApi(admin_api).get_code()
    assert info.git_version == KUBERNETES_VERSION
    assert (info.major, info.minor) == tuple(KUBERNETES_VERSION.removeprefix("v").split(".")[:2])


@pytest.mark.parametrize(
    ("kind", "crd_name"),
    [
        ("LeaderWorkerSet", "leaderworkersets.leaderworkerset.x-k8s.io"),
        ("ComputeDomain", "computedomains.resource.nvidia.com"),
        ("PodMonitor", "podmonitors.monitoring.coreos.com"),
        ("ServiceMonitor", "servicemonitors.monitoring.coreos.com"),
        ("HTTPRoute", "httproutes.gateway.networking.k8s.io"),
        ("InferencePool", "inferencepools.inference.networking.k8s.io"),
        ("InferenceObjective", "inferenceobjectives.inference.networking.x-k8s.io"),
    ],
)
def test_thirdparty_crd_is_established(admin_api: client.ApiClient, kind: str, crd_name: str) -> None:
    raw = client.ApiextensionsV1Api(admin_api).read_custom_resource_definition(crd_name, _preload_content=False)
    crd = json.loads(raw.data)
    assert crd["spec"]["names"]["kind"] == kind
    conditions = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
    assert conditions.get("Established") == "True"
    assert conditions.get("NamesAccepted") == "True"


def test_lws_unknown_field_rejected_under_strict_validation(admin_api: client.ApiClient, namespace: str) -> None:
    api = client.CustomObjectsApi(admin_api)
    body = _minimal_lws("bad")
    body["spec"]["leaderWorkerTemplate"]["sizee"] = 4  # typo'd field
    with pytest.raises(ApiException) as err:
        api.create_namespaced_custom_object(
            LWS_GROUP, LWS_VERSION, namespace, LWS_PLURAL, body, field_validation="Strict"
        )
    assert err.value.status == 400
    status = json.loads(err.value.body)
    assert status["reason"] == "BadRequest"
    assert 'strict decoding error: unknown field "spec.leaderWorkerTemplate.sizee"' in status["message"]


def test_lws_minimal_object_accepted_and_defaulted(admin_api: client.ApiClient, namespace: str) -> None:
    api = client.CustomObjectsApi(admin_api)
    api.create_namespaced_custom_object(
        LWS_GROUP, LWS_VERSION, namespace, LWS_PLURAL, _minimal_lws("ok"), field_validation="Strict"
    )
    stored = api.get_namespaced_custom_object(LWS_GROUP, LWS_VERSION, namespace, LWS_PLURAL, "ok")
    assert stored["spec"]["leaderWorkerTemplate"]["size"] == 2
    assert stored["spec"]["replicas"] == 1  # default from the CRD's structural schema
    assert stored["spec"]["startupPolicy"] == "LeaderCreated"


def test_operator_token_is_the_service_account_without_rbac(operator_api: client.ApiClient) -> None:
    review = client.AuthenticationV1Api(operator_api).create_self_subject_review(client.V1SelfSubjectReview())
    assert review.status.user_info.username == OPERATOR_USER
    assert set(OPERATOR_GROUPS) <= set(review.status.user_info.groups)
    with pytest.raises(ApiException) as err:
        client.CoreV1Api(operator_api).list_secret_for_all_namespaces()
    assert err.value.status == 403
    status = json.loads(err.value.body)
    assert status["reason"] == "Forbidden"
    assert f'User "{OPERATOR_USER}" cannot list resource "secrets"' in status["message"]


def test_kubeconfigs_written(control_plane: ControlPlane) -> None:
    import yaml

    for path, token in ((control_plane.admin_kubeconfig, control_plane.admin_token),
                        (control_plane.operator_kubeconfig, control_plane.operator_token)):
        cfg = yaml.safe_load(path.read_text())
        assert cfg["clusters"][0]["cluster"]["server"] == control_plane.server
        assert Path(cfg["clusters"][0]["cluster"]["certificate-authority"]) == control_plane.ca_file
        assert cfg["users"][0]["user"]["token"] == token
        assert stat.S_IMODE(path.stat().st_mode) == 0o600


@pytest.mark.tier("apiserver")
def test_stop_leaves_no_process_behind(tmp_path: Path) -> None:
    cp = ControlPlane(tmp_path / "cp")
    with cp:
        pids = cp.pids
        assert set(pids) == {"etcd", "kube-apiserver"} and cp.running
        assert sorted(_processes_mentioning(str(cp.state_dir))) == sorted(pids.values())
    assert not cp.running
    for pid in pids.values():
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert _processes_mentioning(str(cp.state_dir)) == []
    cp.stop()  # idempotent


def test_missing_binaries_name_the_build_script(tmp_path: Path) -> None:
    with pytest.raises(MissingBinaryError, match=r"tools/build-binaries\.sh"):
        ControlPlane(tmp_path / "cp", binaries_dir=tmp_path / "empty").start()


@pytest.mark.tier("apiserver")
def test_failed_start_names_component_and_log(tmp_path: Path) -> None:
    bins = tmp_path / "bin"
    bins.mkdir()
    real = find_binaries()
    (bins / real["etcd"].name).symlink_to(real["etcd"])
    fake = bins / real["kube-apiserver"].name
    fake.write_text("#!/bin/sh\necho 'E0000 fake apiserver: cannot start' >&2\nexit 3\n")
    fake.chmod(0o755)
    cp = ControlPlane(tmp_path / "cp", binaries_dir=bins)
    with pytest.raises(ControlPlaneError) as err:
        cp.start()
    message = str(err.value)
    assert "kube-apiserver exited with code 3" in message
    assert str(cp.apiserver_log) in message
    assert "fake apiserver: cannot start" in message
    assert not cp.running and _processes_mentioning(str(cp.state_dir)) == []


@pytest.mark.tier("apiserver")
def test_start_retries_when_a_picked_port_is_taken(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kimik3_dev.devcluster import controlplane

    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        real_free_port = controlplane.free_port
        handed_out: list[int] = []

        def first_one_taken() -> int:
            port = taken if not handed_out else real_free_port()
            handed_out.append(port)
            return port

        monkeypatch.setattr(controlplane, "free_port", first_one_taken)
        with ControlPlane(tmp_path / "cp") as cp:
            assert cp.running and f":{taken}" not in cp.etcd_url
        assert handed_out[0] == taken and len(handed_out) >= 5  # etcd x2 twice, apiserver once
