"""The dev cluster's gateway configuration (``kimik3_dev.devcluster.gateway``) without a cluster:
the endpoints a pool selects, its failure mode, the picker's command line from the operator's
rendering, and Envoy's bootstrap as the real Envoy binary validates it (``envoy --mode validate``)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from kimik3.api.v1alpha1 import KimiK3DeploymentSpec
from kimik3.kube.labels import DEPLOYMENT_LABEL, LWS_WORKER_INDEX_LABEL
from kimik3.render.meta import Owner
from kimik3.render.routing import endpoint_picker
from kimik3.render.httproute import http_route
from kimik3.render.wake import DEPLOYMENT_HEADER, UID_HEADER, WakeEndpoint
from kimik3_dev.devcluster import gateway
from kimik3_dev.devcluster.controlplane import bin_dir
from kimik3_dev.devcluster.gatewaywatch import wake_route
from support.recipes import recipe

POOL = {"spec": {"selector": {"matchLabels": {DEPLOYMENT_LABEL: "k3", LWS_WORKER_INDEX_LABEL: "0"}},
                 "targetPorts": [{"number": 8000}], "endpointPickerRef": {"name": "k3-epp"}}}


def _pod(name: str, ip: str | None, worker: str, ready: bool = True, deleting: bool = False) -> dict:
    meta = {"name": name, "labels": {DEPLOYMENT_LABEL: "k3", LWS_WORKER_INDEX_LABEL: worker}}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-05T00:00:00Z"
    status = {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}
    if ip:
        status["podIP"] = ip
    return {"metadata": meta, "status": status}


def _rendered_picker() -> tuple[dict, dict]:
    spec = KimiK3DeploymentSpec.model_validate(recipe(model={"maxModelLen": 131072})["spec"])
    objects = {o["kind"]: o for o in endpoint_picker(Owner("k3", "team", "uid-1"), spec)}
    return objects["ConfigMap"], objects["Deployment"]


def test_the_picker_runs_with_the_rendered_config_and_args_and_host_ports() -> None:
    configmap, deployment = _rendered_picker()
    picker = gateway.picker_from(configmap, deployment, {"name": "k3-epp-5d9f-x2", "namespace": "team"})
    assert picker.config == configmap["data"]["epp-config.yaml"]
    assert "maxPrefixBlocksToMatch: 1024" in picker.config  # 131072 tokens / 128, the rendering's, not upstream's
    assert picker.env == {"NAMESPACE": "team", "POD_NAME": "k3-epp-5d9f-x2"}
    assert gateway.host_argv(Path("/bin/epp"), picker, Path("/state/epp-config.yaml"), 41002, 41003, 41090) == [
        "/bin/epp", "--pool-name", "k3", "--pool-namespace", "team",
        "--kv-cache-usage-percentage-metric", "vllm:kv_cache_usage_perc", "--metrics-endpoint-auth=false",
        "--tracing=false", "--config-file", "/state/epp-config.yaml", "--grpc-port", "41002",
        "--grpc-health-port", "41003", "--metrics-port", "41090", "--health-checking=true"]


def test_a_picker_whose_config_file_is_not_in_its_configmap_is_refused() -> None:
    configmap, deployment = _rendered_picker()
    configmap["data"] = {"other.yaml": ""}
    with pytest.raises(ValueError, match=r"ConfigMap k3-epp has no data.epp-config.yaml \(the picker's --config-file\)"):
        gateway.picker_from(configmap, deployment, {})
    deployment["spec"]["template"]["spec"]["containers"][0]["args"] = ["--pool-name", "k3"]
    with pytest.raises(ValueError, match="Deployment k3-epp: the container's args give no --config-file"):
        gateway.picker_from(configmap, deployment, {})


def test_a_pool_selects_its_ready_leaders_at_the_target_port() -> None:
    pods = [_pod("g1-0", "127.5.0.9", "0"), _pod("g0-0", "127.5.0.2", "0"), _pod("g0-1", "127.5.0.3", "1"),
            _pod("g2-0", None, "0"), _pod("g3-0", "127.5.0.7", "0", ready=False),
            _pod("g4-0", "127.5.0.8", "0", deleting=True)]
    assert gateway.pool_endpoints(POOL, pods) == [("127.5.0.2", 8000), ("127.5.0.9", 8000)]


def test_failure_mode_defaults_to_fail_close_and_refuses_others() -> None:
    assert gateway.failure_mode(POOL) == "FailClose"
    assert gateway.failure_mode({"spec": {"endpointPickerRef": {"failureMode": "FailOpen"}}}) == "FailOpen"
    with pytest.raises(ValueError, match="failureMode 'Open' is not one of FailOpen, FailClose"):
        gateway.failure_mode({"spec": {"endpointPickerRef": {"failureMode": "Open"}}})


def test_only_fail_open_lets_requests_pass_without_the_picker_to_a_fallback() -> None:
    close = gateway.envoy_config(10080, 10081, 10002, "FailClose", [("127.5.0.2", 8000)])
    opened = gateway.envoy_config(10080, 10081, 10002, "FailOpen", [("127.5.0.2", 8000)])

    def ext_proc(cfg: dict) -> dict:
        hcm = cfg["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
        return next(f["typed_config"] for f in hcm["http_filters"] if f["name"] == "envoy.filters.http.ext_proc")

    def routes(cfg: dict) -> list[str]:
        hcm = cfg["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
        return [r["route"]["cluster"] for r in hcm["route_config"]["virtual_hosts"][0]["routes"]]

    assert ext_proc(close)["failure_mode_allow"] is False and routes(close) == ["pool"]
    assert ext_proc(opened)["failure_mode_allow"] is True and routes(opened) == ["pool", "pool-fallback"]
    (original_dst,) = [c for c in close["static_resources"]["clusters"] if c["name"] == "pool"]
    assert original_dst["original_dst_lb_config"] == {"use_http_header": True,
                                                      "http_header_name": "x-gateway-destination-endpoint"}
    with pytest.raises(ValueError, match="failure mode 'FailSoft'"):
        gateway.envoy_config(1, 2, 3, "FailSoft", [])


WAKE = WakeEndpoint("kimik3-system", "kimik3-operator-wake", 8081)


def test_a_route_to_the_wake_service_goes_to_the_activator_with_the_routes_headers() -> None:
    """The HTTPRoute as the operator renders it: to the pool while awake (Envoy keeps the picker), to
    the wake Service while asleep (Envoy sends to the activator, the rule's header set, no picker)."""
    spec = KimiK3DeploymentSpec.model_validate(recipe(service={"httpRoute": {"parentRefs": [{"name": "gw"}]}})["spec"])
    owner = Owner("k3", "team", "uid-1")
    asleep, awake = http_route(owner, spec, True, WAKE), http_route(owner, spec, True)
    assert wake_route(awake, WAKE, ("127.0.0.1", 4242)) is None and wake_route(None, WAKE, ("127.0.0.1", 4242)) is None
    wake = wake_route(asleep, WAKE, ("127.0.0.1", 4242))
    assert wake == gateway.WakeRoute(("127.0.0.1", 4242), ((DEPLOYMENT_HEADER, "team/k3"), (UID_HEADER, "uid-1")))
    other = WakeEndpoint("elsewhere", "kimik3-operator-wake", 8081)  # not this operator's Service: not followed
    assert wake_route(asleep, other, ("127.0.0.1", 4242)) is None
    (route,) = gateway.route_config("FailClose", wake)["virtual_hosts"][0]["routes"]
    assert route["route"]["cluster"] == "wake"
    assert route["request_headers_to_add"] == [{"header": {"key": k, "value": v}, "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"}
                                               for k, v in ((DEPLOYMENT_HEADER, "team/k3"), (UID_HEADER, "uid-1"))]
    assert route["typed_per_filter_config"]["envoy.filters.http.ext_proc"]["disabled"] is True
    assert [r["route"]["cluster"] for r in gateway.route_config("FailOpen")["virtual_hosts"][0]["routes"]] == \
        ["pool", "pool-fallback"]


def test_routes_are_written_whole_as_a_discovery_response(tmp_path: Path) -> None:
    path = tmp_path / gateway.ROUTES_FILE
    gateway.write_routes(path, gateway.route_config("FailClose"), "7")
    written = json.loads(path.read_text())
    assert written["version_info"] == "7"
    (resource,) = written["resources"]
    assert resource["@type"] == "type.googleapis.com/envoy.config.route.v3.RouteConfiguration"
    assert resource["name"] == gateway.ROUTE_CONFIG and [p.name for p in tmp_path.iterdir()] == [path.name]


@pytest.mark.tier("process")
@pytest.mark.parametrize("mode", gateway.FAILURE_MODES)
def test_envoy_accepts_the_generated_bootstrap(tmp_path: Path, mode: str) -> None:
    envoy = bin_dir() / gateway.ENVOY_BINARY
    config = tmp_path / "envoy.json"
    config.write_text(json.dumps(gateway.envoy_config(10080, 10081, 10002, mode, [("127.5.0.2", 8000)])))
    routed = tmp_path / "routed.json"  # routes from a file (RDS) and the wake cluster, as `dev gateways` runs it
    gateway.write_routes(tmp_path / gateway.ROUTES_FILE, gateway.route_config(mode), "1")
    routed.write_text(json.dumps(gateway.envoy_config(10080, 10081, 10002, mode, [("127.5.0.2", 8000)],
                                                      tmp_path / gateway.ROUTES_FILE, ("127.0.0.1", 10003))))
    proc = subprocess.run([str(envoy), "--mode", "validate", "-c", str(routed), "--disable-hot-restart"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0 and f"configuration '{routed}' OK" in proc.stdout + proc.stderr, \
        proc.stdout[-2000:] + proc.stderr[-2000:]
    proc = subprocess.run([str(envoy), "--mode", "validate", "-c", str(config), "--disable-hot-restart"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0 and f"configuration '{config}' OK" in proc.stdout + proc.stderr, \
        proc.stdout[-2000:] + proc.stderr[-2000:]


def test_the_cli_asks_for_namespace_slash_pool() -> None:
    from click.testing import CliRunner

    from kimik3_dev.devcluster.cli import dev
    result = CliRunner().invoke(dev, ["gateway", "k3"])
    assert result.exit_code == 2 and "'k3': give NAMESPACE/POOL, e.g. default/k3" in result.output
