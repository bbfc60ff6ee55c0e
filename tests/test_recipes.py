"""Every recipe: `kimik3 validate` accepts it with the expected shape, its header says its
intended use, expected speed and the source of the figure, and the real API server plus the
operator turn it into the expected children. Also the two fields the dedicated-endpoint recipe
needs: spec.service.apiKeySecret (VLLM_API_KEY from a Secret) and spec.service.httpRoute."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import uuid
from typing import Any

import pytest
import yaml
from kubernetes import client

from kimik3.admission import admit
from kimik3.api.errors import SpecErrors
from kimik3.autoscaler import perfmodel
from kimik3.controller.kube import Invalid
from kimik3.controller.placementmix import clashes, placement
from kimik3.engine.overrides import describe
from kimik3.kube.kinds import HTTP_ROUTE
from kimik3.render.meta import engine_set_name
from kimik3_dev.devcluster import kueue
from support.cluster import CD, CR, LWS, reconciled
from support.files import header
from support.recipes import RECIPE_FILES as RECIPES
from support.recipes import RECIPES_DIR, documents, recipe
from support.rendering import render_cr
from support.waiting import wait_for

ROUTE = HTTP_ROUTE.type_meta
UID = "00000000-0000-4000-8000-000000000001"
Shape = tuple[str, str, int, str, str]
"""(accelerator, strategy, GPUs per group, decode backend, speculative method)."""
PUBLISHED_TOK_S: dict[Shape, set[int]] = {
    **{("gb300", "tp", tp, "stock", "none"): {round(v)} for tp, v in perfmodel.TOKS_STOCK_NOSPEC.items()},
    **{("gb300", "tp", tp, "stock", "dspark"): {round(v)} for tp, v in perfmodel.TOKS_STOCK_DSPARK.items()},
    ("gb300", "tp", 16, "latency_specialized", "dspark"): {round(perfmodel.TOKS_MK_NEWS),
                                                           round(perfmodel.TOKS_MK_TP16_AL6)},
}
"""Batch-1 tok/s per user published for each shape (shared/reference/kimi-k3-and-vllm.md, "Measured
decode speed", as the perf model holds them: 111/118 stock, 331/370 DSpark, 423 and > 840 megakernel
+ DSpark on 16 GB300). Only GB300 TP8/TP16 have figures."""
MODEL_WORKLOAD = {"stock": "blog", "latency_specialized": "news"}
"""Workload a recipe's perf-model figure is taken at, by decode path: the one behind that path's
published figures (331/370: the blog posts'; 423: the news item's), so the figures compare."""
NEW_RECIPES = {"gb200-tp16-megakernel-dspark.yaml", "h200-tp16-two-nodes.yaml", "b300-tp8-single-node.yaml",
               "dedicated-endpoint.yaml", "gb300-tp16-megakernel-dspark.yaml"}

# recipe -> (CR name, nodes per group, GPUs per node, accelerator, ComputeDomain, HTTPRoute)
SHAPES = {
    "gb300-tp8-megakernel-dspark.yaml": ("k3-latency", 2, 4, "gb300", True, False),
    "gb300-tp16-megakernel-dspark.yaml": ("k3-tp16", 4, 4, "gb300", True, False),
    "gb300-dep16-throughput.yaml": ("k3-throughput", 4, 4, "gb300", True, False),
    "gb200-tp16-megakernel-dspark.yaml": ("k3-gb200", 4, 4, "gb200", True, False),
    "h200-tp16-two-nodes.yaml": ("k3-h200", 2, 8, "h200", False, False),
    "b300-tp8-single-node.yaml": ("k3-b300", 1, 8, "b300", False, False),
    "dedicated-endpoint.yaml": ("k3-acme", 2, 4, "gb300", True, True),
}
PRODUCT = {"gb300": "NVIDIA-GB300", "gb200": "NVIDIA-GB200", "h200": "NVIDIA-H200", "b300": "NVIDIA-B300"}


def test_recipes_are_the_documented_set():
    assert {p.name for p in RECIPES} == set(SHAPES)
    readme = (RECIPES_DIR / "README.md").read_text()
    for p in RECIPES:
        assert f"`{p.name}`" in readme, f"{p.name} missing from recipes/README.md"
    assert "Prefill/decode disaggregation" in readme and "not supported" in readme


@pytest.mark.tier("process")  # the CLI as a process
@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.name)
def test_kimik3_validate_accepts_the_recipe(path):
    name, nodes, gpus, accelerator, cd, _ = SHAPES[path.name]
    out = subprocess.run([sys.executable, "-m", "kimik3.cli", "validate", "-f", str(path)],
                         capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    placement = "a ComputeDomain and clique placement" if cd else "no ComputeDomain"
    first, *warnings = out.stdout.strip().splitlines()
    assert first == f"{name}: valid: {nodes} node(s) x {gpus} {accelerator} GPUs per group, {placement}"
    # then the settings vLLM 0.33 will narrow (kimik3.engine.overrides), e.g. the megakernel's 64-token steps
    [doc] = [d for d in documents(path) if d.get("kind") == "KimiK3Deployment"]
    assert warnings == [f"  warning: {describe(o)}" for o in admit(doc["spec"]).overrides]


def shape_of(path) -> tuple[Shape, int]:
    """The recipe's shape (the key of PUBLISHED_TOK_S) and the perf model's batch-1 tok/s per user
    for it, rounded."""
    admitted = admit(recipe(path)["spec"])
    shape = perfmodel.EngineShape.from_spec(admitted.spec, admitted.plan)
    key = (shape.accelerator, shape.strategy, shape.gpus, shape.decode_backend, shape.spec_method)
    modelled = perfmodel.decode_point(shape, 1, MODEL_WORKLOAD[shape.decode_backend]).tokens_per_s_per_user
    return key, round(modelled)


def check_speeds(text: str, path) -> None:
    """Every ``N tok/s`` in ``text`` is published for the recipe's own shape, or is the perf model's
    figure for it and ``text`` says "perf model"; a shape without a published figure cites the
    model's. AssertionError naming the shapes a wrong figure was published for."""
    key, modelled = shape_of(path)
    cited = {int(n) for n in re.findall(r"(\d+) tok/s", text)}
    published = PUBLISHED_TOK_S.get(key, set())
    labelled = "perf model" in text
    if published:
        assert cited & published, f"{path.name}: cites none of {sorted(published)} tok/s published for {key}"
    else:
        assert modelled in cited and labelled, (
            f"{path.name}: nothing is published for {key}: cite the perf model's {modelled} tok/s, "
            "labelled \"perf model\"")
    wrong = cited - published - ({modelled} if labelled else set())
    assert not wrong, (f"{path.name} ({key}) cites {sorted(wrong)} tok/s, published for "
                       f"{[s for s, figures in PUBLISHED_TOK_S.items() if figures & wrong]}; "
                       f"its own: published {sorted(published)}, perf model {modelled}")


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.name)
def test_recipe_documents_use_speed_and_source(path):
    text = header(path, sep=" ")
    assert "Expected speed" in text and "kimi-k3-and-vllm.md" in text
    check_speeds(text, path)
    if path.name in NEW_RECIPES:
        assert "Intended use:" in text and "Source:" in text


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.name)
def test_readme_row_cites_the_recipes_own_speed(path):
    rows = [line for line in (RECIPES_DIR / "README.md").read_text().splitlines()
            if line.startswith(f"| `{path.name}` |")]
    assert len(rows) == 1, rows
    check_speeds(rows[0].split("|")[-2], path)


@pytest.mark.parametrize("path,text,words", [
    # The TP8 recipe's old header: 423 is the 16-GB300 figure, 331 the stock path's.
    ("gb300-tp8-megakernel-dspark.yaml", "~331 tok/s per user for TP8 + DSpark on the stock path and "
     "423 tok/s with the megakernel path", "nothing is published for ('gb300', 'tp', 8"),
    ("gb300-tp8-megakernel-dspark.yaml", "perf model: 339 tok/s; 423 tok/s on TP16",
     "cites [423] tok/s, published for [('gb300', 'tp', 16, 'latency_specialized', 'dspark')]"),
    ("gb300-tp8-megakernel-dspark.yaml", "339 tok/s", "labelled"),
    ("gb300-tp16-megakernel-dspark.yaml", "423 tok/s; 370 tok/s on the stock path", "cites [370] tok/s"),
    ("b300-tp8-single-node.yaml", "no B300 figure; GB300 TP8: 331 tok/s DSpark", "perf model's 339"),
])
def test_a_speed_of_another_shape_is_refused(path, text, words):
    with pytest.raises(AssertionError) as refused:
        check_speeds(text, RECIPES_DIR / path)
    assert words in str(refused.value)


def test_megakernel_recipes_respect_its_limits():
    """The megakernel path: SM100/SM103, TP 8 or 16, dspark with <= 7 tokens (kimi-k3-and-vllm.md)."""
    for path in RECIPES:
        spec = recipe(path)["spec"]
        if spec["engine"].get("decodeBackend") != "latency_specialized":
            continue
        assert spec["topology"]["accelerator"] != "h200"
        assert spec["topology"]["strategy"] == "tp" and spec["topology"]["tensorParallelSize"] in (8, 16)
        assert spec["speculativeDecoding"]["method"] == "dspark"
        assert spec["speculativeDecoding"]["numSpeculativeTokens"] <= 7


def kueue_alternative(path) -> dict[str, Any] | None:
    """The commented ``scheduling`` block of a recipe (its lines ``  # <yaml>   # <comment>``),
    uncommented and parsed; None when the recipe has none."""
    lines = path.read_text().splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("  # scheduling:")), None)
    if start is None:
        return None
    block = []
    for line in lines[start:]:
        found = re.match(r"^  # (\s*\S[^#]*?)\s+#", line)
        if not found:
            break
        block.append(found.group(1))
    return yaml.safe_load("\n".join(block))


def test_rack_scale_recipes_ship_one_placement_mode_per_pool():
    """Issue 24: the TP16 GB300 recipe is placed by Kueue and the other GB300/GB200 recipes
    exclusive, which must not share racks (controller/placementmix.py finds the mix). Each
    exclusive rack-scale recipe carries Kueue's placement, commented, with the TP16 recipe's
    LocalQueue: uncommented, it no longer clashes with the TP16 recipe, and admission accepts it."""
    packed = admit(recipe("gb300-tp16-megakernel-dspark.yaml")["spec"])
    assert packed.spec.scheduling.placement.mode == "kueue"
    tp16 = placement("inference", "k3-tp16", packed)
    rack_scale = [p for p in RECIPES if admit(recipe(p)["spec"]).plan.clique_placement]
    assert {p.name for p in rack_scale} == {"gb300-tp8-megakernel-dspark.yaml", "gb300-tp16-megakernel-dspark.yaml",
                                            "gb300-dep16-throughput.yaml", "gb200-tp16-megakernel-dspark.yaml",
                                            "dedicated-endpoint.yaml"}
    for path in rack_scale:
        if path.name == "gb300-tp16-megakernel-dspark.yaml":
            continue
        shipped = admit(recipe(path)["spec"])
        alternative = kueue_alternative(path)
        assert alternative is not None, f"{path.name}: no commented kueue placement"
        assert alternative == {"scheduling": {"placement": {"mode": "kueue", "queueName": "inference"}}}, path.name
        uncommented = admit(recipe(path, **alternative)["spec"])
        clash = bool(clashes(tp16, [placement("inference", path.stem, shipped)]))
        assert clash == (shipped.plan.profile.product_label == packed.plan.profile.product_label), path.name
        assert clashes(tp16, [placement("inference", path.stem, uncommented)]) == [], path.name


# ---------------------------------------------------------------- render (no cluster) ---------


def env_of(template: dict[str, Any]) -> list[dict[str, Any]]:
    return template["spec"]["containers"][0]["env"]


def test_api_key_goes_to_the_api_servers_only_from_the_secret():
    rendered = render_cr(recipe("dedicated-endpoint.yaml", uid=UID))
    lws = next(o for o in rendered.objects if o["kind"] == "LeaderWorkerSet")
    tmpl = lws["spec"]["leaderWorkerTemplate"]
    key = {"name": "VLLM_API_KEY", "valueFrom": {"secretKeyRef": {"name": "k3-api-key", "key": "api-key"}}}
    assert env_of(tmpl["leaderTemplate"]).count(key) == 1
    assert not any(e["name"] == "VLLM_API_KEY" for e in env_of(tmpl["workerTemplate"])), "headless ranks serve no API"
    # A literal VLLM_API_KEY in engine.env is refused: it would sit in plain text next to the Secret's.
    cr = recipe("dedicated-endpoint.yaml", uid=UID)
    cr["spec"]["engine"]["env"] = [{"name": "VLLM_API_KEY", "value": "leaked"}]
    with pytest.raises(SpecErrors) as refused:
        render_cr(cr)
    assert [e.path for e in refused.value.errors] == ["spec.engine.env[0].name"]
    assert "leaked" not in str(refused.value)
    # Without apiKeySecret: no key at all (vLLM serves without authentication).
    lws = next(o for o in render_cr(recipe("b300-tp8-single-node.yaml", uid=UID)).objects
               if o["kind"] == "LeaderWorkerSet")
    assert not any(e["name"] == "VLLM_API_KEY" for e in env_of(lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]))


def test_api_key_on_a_single_node_group():
    cr = recipe("b300-tp8-single-node.yaml", uid=UID,
                service={"apiKeySecret": {"name": "s", "key": "k"}})
    lws = next(o for o in render_cr(cr).objects if o["kind"] == "LeaderWorkerSet")
    tmpl = lws["spec"]["leaderWorkerTemplate"]
    assert "leaderTemplate" not in tmpl  # one pod per group: it serves the API
    assert {"name": "VLLM_API_KEY", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}} in env_of(
        tmpl["workerTemplate"])


def test_http_route_routes_v1_to_the_client_service():
    rendered = render_cr(recipe("dedicated-endpoint.yaml", uid=UID))
    route = next(o for o in rendered.objects if o["kind"] == "HTTPRoute")
    assert route["apiVersion"] == "gateway.networking.k8s.io/v1"
    assert route["metadata"]["ownerReferences"][0]["kind"] == "KimiK3Deployment"
    assert route["spec"] == {
        "parentRefs": [{"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "inference-gateway",
                        "namespace": "gateway-system", "sectionName": "https"}],
        "hostnames": ["acme.inference.example.com"],
        "rules": [{"matches": [{"path": {"type": "PathPrefix", "value": "/v1"}}],
                   "backendRefs": [{"group": "", "kind": "Service", "name": "k3-acme", "port": 8000}]}],
    }
    service = next(o for o in rendered.objects if o["kind"] == "Service")
    assert service["metadata"]["name"] == "k3-acme" and service["spec"]["ports"][0]["port"] == 8000
    # Without httpRoute the route must not exist (a removed field deletes it).
    plain = render_cr(recipe("b300-tp8-single-node.yaml", uid=UID))
    assert "HTTPRoute" not in {o["kind"] for o in plain.objects} and HTTP_ROUTE in {a.kind for a in plain.absent}


def test_http_route_minimal_form():
    cr = recipe("b300-tp8-single-node.yaml", uid=UID,
                service={"port": 9000, "httpRoute": {"parentRefs": [{"name": "gw"}],
                                                    "pathPrefixes": ["/v1/chat", "/v1/models"]}})
    route = next(o for o in render_cr(cr).objects if o["kind"] == "HTTPRoute")
    assert route["spec"]["parentRefs"] == [{"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "gw"}]
    assert "hostnames" not in route["spec"]
    assert route["spec"]["rules"][0]["matches"] == [{"path": {"type": "PathPrefix", "value": "/v1/chat"}},
                                                    {"path": {"type": "PathPrefix", "value": "/v1/models"}}]
    assert route["spec"]["rules"][0]["backendRefs"][0]["port"] == 9000


# ---------------------------------------------------------------- real API server --------------
# `operator` and `kube` are the session's (tests/conftest.py): one operator, cluster-wide, as admin.


def contains(stored: Any, sent: Any) -> bool:
    """Everything sent is stored as sent (the API server may add defaults, nothing else)."""
    if isinstance(sent, dict):
        return isinstance(stored, dict) and all(k in stored and contains(stored[k], v) for k, v in sent.items())
    return stored == sent


def loopback_prometheus(cr: dict[str, Any]) -> dict[str, Any]:
    """Tests reach nothing but 127.0.0.1: point an autoscaling recipe's Prometheus at a closed
    loopback port (the operator then holds replicas and says the metrics are unavailable)."""
    source = ((cr["spec"].get("autoscaling") or {}).get("metricsSource") or {})
    if source.get("prometheusUrl"):
        source["prometheusUrl"] = "http://127.0.0.1:9"
    return cr


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.name)
def test_recipe_is_applied_and_reconciled(operator, kube, admin_api, namespace, kueue_queue, path):
    name, nodes, gpus, accelerator, with_cd, with_route = SHAPES[path.name]
    docs = documents(path)
    for doc in docs:
        if doc["kind"] == "Namespace":
            assert doc["metadata"]["name"] == recipe(path)["metadata"]["namespace"]
    cr = loopback_prometheus(recipe(path, namespace=namespace))
    placement = cr["spec"].get("scheduling", {}).get("placement", {})
    if placement.get("mode") == "kueue":  # the LocalQueue the recipe's header asks for (controller/queues.py)
        kube.apply(kueue.local_queue(namespace, kueue.CLUSTER_QUEUE, placement["queueName"]))
    if cr["spec"].get("service", {}).get("apiKeySecret"):
        ref = cr["spec"]["service"]["apiKeySecret"]
        client.CoreV1Api(admin_api).create_namespaced_secret(namespace, {
            "metadata": {"name": ref["name"]}, "stringData": {ref["key"]: uuid.uuid4().hex}})
    created = kube.apply(cr, force=False)  # server-side apply, strict field validation
    assert contains(created["spec"], cr["spec"]), "the API server pruned or changed a field of the recipe"
    obj = reconciled(kube, namespace, name, generation=1)
    assert obj["status"]["plan"] == {"gpusPerNode": gpus, "nodesPerGroup": nodes, "gpusPerGroup": gpus * nodes,
                                     "computeDomain": with_cd}
    lws = kube.get(*LWS, namespace, engine_set_name(name))
    assert lws["spec"]["leaderWorkerTemplate"]["size"] == nodes
    pod = (lws["spec"]["leaderWorkerTemplate"].get("leaderTemplate")
           or lws["spec"]["leaderWorkerTemplate"]["workerTemplate"])["spec"]
    assert pod["nodeSelector"]["nvidia.com/gpu.product"] == PRODUCT[accelerator]
    assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == gpus
    assert (kube.get(*CD, namespace, name) is not None) == with_cd
    route = kube.get(*ROUTE, namespace, name)
    assert (route is not None) == with_route
    if with_route:
        assert route["spec"]["parentRefs"][0]["name"] == "inference-gateway"
        assert route["spec"]["rules"][0]["matches"] == [{"path": {"type": "PathPrefix", "value": "/v1"}}]
        leader_env = lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0]["env"]
        assert {"name": "VLLM_API_KEY", "valueFrom": {"secretKeyRef": {"name": "k3-api-key", "key": "api-key"}}} \
            in leader_env
        podmonitor = kube.get("monitoring.coreos.com/v1", "PodMonitor", namespace, name)
        assert podmonitor["metadata"]["labels"]["release"] == "prometheus"
        # Taking the route away deletes it.
        kube.patch_merge(*CR, namespace, name, {"spec": {"service": {"httpRoute": None}}})
        wait_for(lambda: kube.get(*ROUTE, namespace, name) is None, 20, "HTTPRoute deleted")


@pytest.mark.parametrize("spec,path", [
    ({"idle": {"stopAfter": "soon"}, "autoscaling": {"metricsSource": {"type": "podScrape"}}}, "spec.idle.stopAfter"),
    ({"autoscaling": {"ttftTarget": {"value": "fast"}}}, "spec.autoscaling.ttftTarget.value"),
    ({"rollout": {"progressDeadline": "later"}}, "spec.rollout.progressDeadline"),
    ({"rollout": {"progressDeadline": "2h"}, "probes": {"loadTimeout": "long"}}, "spec.probes.loadTimeout"),
])
def test_a_bad_duration_gets_the_patterns_error_alone(kube, namespace, spec, path):
    """A string that is no duration is refused with the pattern's error only; the CEL rules that
    compare durations pass it instead of adding a type-conversion error (a new user's
    ``idle.stopAfter: soon`` printed both, 2026-12-05)."""
    cr = recipe("b300-tp8-single-node.yaml", name=f"bad-{uuid.uuid4().hex[:6]}", namespace=namespace)
    for key, value in spec.items():
        cr["spec"][key] = {**cr["spec"].get(key, {}), **value}
    with pytest.raises(Invalid) as err:
        kube.apply(cr, force=False)
    assert err.value.status == 422, err.value.body
    causes = json.loads(err.value.body)["details"]["causes"]
    assert [(c["field"], c["message"].split(":")[0]) for c in causes] == [(path, "Invalid value")], causes
    assert "should match" in causes[0]["message"]


@pytest.mark.parametrize("field,value,path,words", [
    ("hostnames", ["Bad_Host"], "spec.service.httpRoute.hostnames[0]", "should match"),
    ("pathPrefixes", ["v1"], "spec.service.httpRoute.pathPrefixes[0]", "should match '^/'"),
    ("parentRefs", [], "spec.service.httpRoute.parentRefs", "should have at least 1 items"),
])
def test_api_server_refuses_a_bad_route(kube, namespace, field, value, path, words):
    cr = recipe("b300-tp8-single-node.yaml", name=f"bad-{uuid.uuid4().hex[:6]}", namespace=namespace)
    cr["spec"]["service"] = {"httpRoute": {"parentRefs": [{"name": "gw"}], field: value}}
    with pytest.raises(Invalid) as err:
        kube.apply(cr, force=False)
    assert err.value.status == 422, err.value.body
    causes = json.loads(err.value.body)["details"]["causes"]
    assert any(c.get("field") == path and words in c["message"] for c in causes), causes
