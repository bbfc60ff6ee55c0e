"""spec.routing rendered (``kimik3.render.routing``, ``render.httproute``): the InferencePool selects the
group leaders on the engine's port and names the picker's Service; the picker's configuration is an
EndpointPickerConfig of v1.2.1 with the recipe's prefix block and a 1M-token prefix; the HTTPRoute's
backend is the pool, or the Service on a cluster without the InferencePool kind.
"""

from __future__ import annotations

import yaml

from kimik3.render.children import Absent
from kimik3.kube.kinds import DEPLOYMENT, INFERENCE_POOL, SERVICE
from support.recipes import recipe
from support.rendering import render_cr

UID = "7a1c2b9e-0000-4000-8000-000000000002"
ROUTE = {"httpRoute": {"parentRefs": [{"name": "inference-gw", "namespace": "gateways"}]}}
LEADERS = {"inference.kimik3.io/deployment": "k3-routed", "leaderworkerset.sigs.k8s.io/worker-index": "0"}


def routed(**picker):
    return recipe("gb300-tp8-megakernel-dspark.yaml", name="k3-routed", namespace="serving", uid=UID,
                  routing={"enabled": True, "endpointPicker": picker}, service={**ROUTE, "port": 8100})


def one(out, kind: str, name: str) -> dict:
    (obj,) = [o for o in out.objects if o["kind"] == kind and o["metadata"]["name"] == name]
    return obj


def test_pool_selects_the_leaders_on_the_engine_port_and_names_the_picker():
    pool = one(render_cr(routed()), "InferencePool", "k3-routed")
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1"
    assert pool["spec"] == {
        "selector": {"matchLabels": LEADERS},
        "targetPorts": [{"number": 8100}],
        "endpointPickerRef": {"group": "", "kind": "Service", "name": "k3-routed-epp", "port": {"number": 9002},
                              "failureMode": "FailOpen"},
    }
    assert pool["metadata"]["ownerReferences"][0]["uid"] == UID


def test_failure_mode_and_image_are_the_specs():
    out = render_cr(routed(failureMode="FailClose", image="mirror.example/epp:v1.2.1"))
    assert one(out, "InferencePool", "k3-routed")["spec"]["endpointPickerRef"]["failureMode"] == "FailClose"
    (container,) = one(out, "Deployment", "k3-routed-epp")["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "mirror.example/epp:v1.2.1"


def test_http_route_points_at_the_pool():
    route = one(render_cr(routed()), "HTTPRoute", "k3-routed")
    assert route["spec"]["rules"][0]["backendRefs"] == [
        {"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": "k3-routed"}]
    assert route["spec"]["parentRefs"] == [{"group": "gateway.networking.k8s.io", "kind": "Gateway",
                                            "name": "inference-gw", "namespace": "gateways"}]


def test_without_the_pool_kind_the_route_goes_to_the_service_and_no_picker_is_made():
    out = render_cr(routed(), inference_pools=False)
    route = one(out, "HTTPRoute", "k3-routed")
    assert route["spec"]["rules"][0]["backendRefs"] == [{"group": "", "kind": "Service", "name": "k3-routed",
                                                          "port": 8100}]
    assert not [o for o in out.objects if o["metadata"]["name"] == "k3-routed-epp" or o["kind"] == "InferencePool"]
    # the picker goes if it was made before the CRD went; the pool kind is not served: nothing to delete
    assert Absent(DEPLOYMENT, "k3-routed-epp") in out.absent and Absent(SERVICE, "k3-routed-epp") in out.absent
    assert INFERENCE_POOL not in {a.kind for a in out.absent}


def test_routing_off_is_the_default_and_lists_every_routing_child_absent():
    out = render_cr(recipe("gb300-tp8-megakernel-dspark.yaml", name="k3-plain", uid=UID, service=ROUTE))
    assert not [o for o in out.objects if o["kind"] in ("InferencePool", "Deployment", "Role")]
    assert one(out, "HTTPRoute", "k3-plain")["spec"]["rules"][0]["backendRefs"][0]["kind"] == "Service"
    assert {(a.kind.kind, a.name) for a in out.absent} >= {
        ("InferencePool", "k3-plain"), ("Deployment", "k3-plain-epp"), ("Service", "k3-plain-epp"),
        ("ConfigMap", "k3-plain-epp"), ("ServiceAccount", "k3-plain-epp"), ("Role", "k3-plain-epp"),
        ("RoleBinding", "k3-plain-epp")}
    assert ("Service", "k3-plain") not in {(a.kind.kind, a.name) for a in out.absent}


def test_picker_configuration_is_the_recipes_scoring():
    config = yaml.safe_load(one(render_cr(routed()), "ConfigMap", "k3-routed-epp")["data"]["epp-config.yaml"])
    assert config["apiVersion"] == "inference.networking.x-k8s.io/v1alpha1"
    assert config["kind"] == "EndpointPickerConfig"
    plugins = {p["type"]: p.get("parameters") for p in config["plugins"]}
    assert set(plugins) == {"queue-scorer", "kv-cache-utilization-scorer", "prefix-cache-scorer", "max-score-picker"}
    prefix = plugins["prefix-cache-scorer"]
    # until the engines report their block (autoTune): 128 tokens, the alignment of every K3 block,
    # at the picker's 4 characters per token; the longest prefix considered is K3's whole context
    assert prefix == {"autoTune": True, "blockSize": 512, "maxPrefixBlocksToMatch": 8192}
    assert prefix["maxPrefixBlocksToMatch"] * prefix["blockSize"] // 4 == 1_048_576
    (profile,) = config["schedulingProfiles"]
    assert [p["type"] for p in config["plugins"]][-1] == "max-score-picker"
    assert {p["pluginRef"]: p.get("weight") for p in profile["plugins"]} == {
        "queue-scorer": 2, "kv-cache-utilization-scorer": 2, "prefix-cache-scorer": 3, "max-score-picker": None}


def test_with_a_host_kv_tier_the_picker_indexes_what_gpus_and_host_hold():
    """autoTune would size the index to the engines' num_gpu_blocks (896 at GB300 TP8) and forget
    the prefixes the host tier keeps: off, with the engines' 1024-token block and GPU + host blocks
    (896 + 2446 for 1000Gi over the 8 GPUs' pages)."""
    cr = routed()
    cr["spec"]["engine"]["kvOffload"] = {"size": "1000Gi"}
    config = yaml.safe_load(one(render_cr(cr), "ConfigMap", "k3-routed-epp")["data"]["epp-config.yaml"])
    (prefix,) = [p["parameters"] for p in config["plugins"] if p["type"] == "prefix-cache-scorer"]
    assert prefix == {"autoTune": False, "blockSize": 4096, "maxPrefixBlocksToMatch": 8192,
                      "lruCapacityPerServer": 896 + 2446}


def test_picker_deployment_service_and_least_privilege_role():
    out = render_cr(routed())
    deployment = one(out, "Deployment", "k3-routed-epp")
    spec = deployment["spec"]
    assert spec["replicas"] == 1 and spec["strategy"] == {"type": "Recreate"}
    pod = spec["template"]
    selector = spec["selector"]["matchLabels"]
    assert selector.items() <= pod["metadata"]["labels"].items()
    assert "leaderworkerset.sigs.k8s.io/worker-index" not in pod["metadata"]["labels"]  # not a pool endpoint
    (container,) = pod["spec"]["containers"]
    args = container["args"]
    assert args[args.index("--pool-name") + 1] == "k3-routed" and args[args.index("--pool-namespace") + 1] == "serving"
    assert args[args.index("--config-file") + 1] == "/config/epp-config.yaml"
    assert args[args.index("--kv-cache-usage-percentage-metric") + 1] == "vllm:kv_cache_usage_perc"
    assert "--metrics-endpoint-auth=false" in args
    assert container["readinessProbe"]["grpc"] == {"port": 9003, "service": "inference-extension"}
    assert pod["spec"]["serviceAccountName"] == "k3-routed-epp"
    assert pod["spec"]["volumes"] == [{"name": "config", "configMap": {"name": "k3-routed-epp"}}]
    service = one(out, "Service", "k3-routed-epp")
    assert service["spec"]["selector"] == selector
    assert {p["name"]: (p["port"], p["targetPort"]) for p in service["spec"]["ports"]} == {
        "grpc-ext-proc": (9002, 9002), "http-metrics": (9090, 9090)}
    role = one(out, "Role", "k3-routed-epp")
    assert role["rules"] == [
        {"apiGroups": ["inference.networking.k8s.io"], "resources": ["inferencepools"], "verbs": ["get", "list", "watch"],
         "resourceNames": ["k3-routed"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["inference.networking.x-k8s.io"], "resources": ["inferenceobjectives"],
         "verbs": ["get", "list", "watch"]}]
    binding = one(out, "RoleBinding", "k3-routed-epp")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "k3-routed-epp"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "k3-routed-epp", "namespace": "serving"}]
    assert one(out, "ServiceAccount", "k3-routed-epp")["metadata"]["namespace"] == "serving"


def test_the_client_service_stays_beside_the_pool():
    service = one(render_cr(routed()), "Service", "k3-routed")
    assert service["spec"]["selector"] == LEADERS



def test_a_shorter_context_bounds_the_prefix_considered():
    cr = routed()
    cr["spec"]["model"]["maxModelLen"] = 131072
    config = yaml.safe_load(one(render_cr(cr), "ConfigMap", "k3-routed-epp")["data"]["epp-config.yaml"])
    (prefix,) = [p["parameters"] for p in config["plugins"] if p["type"] == "prefix-cache-scorer"]
    assert prefix["maxPrefixBlocksToMatch"] == 1024  # 131072 / 128
