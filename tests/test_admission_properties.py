"""Property tests: thousands of generated specs, valid and invalid, through admission.

For every generated spec: the operator's admission never crashes; every refusal names a field
path under ``spec.`` and a reason; whatever it admits renders into children. Against the real
API server (server-side dry run): whatever the API server accepts, the operator either renders
or refuses with a field path; and what the operator admits the API server accepts too (the CEL
rules and the operator's checks agree on everything the schema can see).
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kubernetes.client.exceptions import ApiException

from kimik3.admission import Admitted, admit
from kimik3.api.errors import SpecErrors
from kimik3.controller.kube import ApiError
from kimik3.render.children import render
from kimik3.render.meta import Owner

ACCELERATORS = ["gb300", "gb200", "b300", "b200", "h200"]
METHODS = ["dspark", "eagle3", "mtp", "ngram", "none"]


def maybe(strategy: st.SearchStrategy) -> st.SearchStrategy:
    return st.one_of(st.none(), strategy)


def drop_none(d: dict[str, Any]) -> dict[str, Any]:
    return {k: drop_none(v) if isinstance(v, dict) else v for k, v in d.items() if v is not None}


def spec_strategy(acc, strategy, tp, pp, dp, ep, backend, method, k, draft, lmin, lmax, adaptive, eager, variant,
                  source, extra, replicas, kv, mem) -> st.SearchStrategy:
    return st.builds(
        lambda *a: drop_none({
            "model": {"variant": a[14], "source": a[15]},
            "engine": {"decodeBackend": a[6], "enforceEager": a[13], "extraArgs": a[16], "kvCacheDtype": a[18],
                       "gpuMemoryUtilization": a[19]},
            "speculativeDecoding": {"method": a[7], "numSpeculativeTokens": a[8], "draftModel": a[9],
                                    "promptLookupMin": a[10], "promptLookupMax": a[11], "adaptiveVerification": a[12]},
            "topology": {"accelerator": a[0], "strategy": a[1], "tensorParallelSize": a[2],
                         "pipelineParallelSize": a[3], "dataParallelSize": a[4], "expertParallel": a[5]},
            "replicas": a[17],
        }),
        acc, strategy, tp, pp, dp, ep, backend, method, k, draft, lmin, lmax, adaptive, eager, variant, source,
        extra, replicas, kv, mem)


@st.composite
def plausible(draw) -> dict[str, Any]:
    """Specs a user might write: coherent fields, shapes free (roughly a third are admitted)."""
    method = draw(st.sampled_from(METHODS))
    sd: dict[str, Any] = {"method": method}
    if method != "none":
        sd["numSpeculativeTokens"] = draw(st.integers(1, 8))
    if method in ("dspark", "eagle3"):
        sd["draftModel"] = "Inferact/Kimi-K3-DSpark" if method == "dspark" else "x/eagle3"
    if method == "ngram":
        sd["promptLookupMax"] = draw(st.integers(1, 8))
    strategy = draw(st.sampled_from(["tp", "dep", "tp-dp"]))
    topo: dict[str, Any] = {"accelerator": draw(st.sampled_from(ACCELERATORS)), "strategy": strategy}
    if strategy == "tp":
        topo["tensorParallelSize"] = draw(st.sampled_from([4, 8, 16, 24]))
        topo["pipelineParallelSize"] = draw(st.sampled_from([1, 1, 1, 2]))
    else:
        topo["dataParallelSize"] = draw(st.sampled_from([4, 8, 16, 32]))
        if strategy == "tp-dp":
            topo["tensorParallelSize"] = draw(st.sampled_from([1, 2, 4, 8]))
            topo["expertParallel"] = draw(st.booleans())
    return {
        "model": {"variant": draw(st.sampled_from(["mxfp4", "nvfp4"])),
                  "source": draw(st.sampled_from([{"pvc": {"claimName": "w"}}, {"hostPath": {"path": "/models/k3"}},
                                                  {"hub": {}}]))},
        "engine": {"decodeBackend": draw(st.sampled_from(["stock", "latency_specialized"])),
                   "extraArgs": draw(st.lists(st.sampled_from(["--max-log-len=10", "--seed=1"]), max_size=2))},
        "speculativeDecoding": sd, "topology": topo, "replicas": draw(st.integers(0, 5)),
    }


# Hostile specs: illegal values, owned flags, contradictory fields.
small_ints = st.integers(min_value=-2, max_value=80)
hostile = spec_strategy(
    st.sampled_from(ACCELERATORS + ["mi300"]), st.sampled_from(["tp", "dep", "tp-dp", "pp"]),
    maybe(st.sampled_from([1, 2, 4, 6, 8, 12, 16, 32, 0])), maybe(st.sampled_from([1, 2, 3])),
    maybe(st.sampled_from([1, 2, 4, 6, 8, 16, 24, 32])), maybe(st.booleans()),
    st.sampled_from(["stock", "latency_specialized"]), st.sampled_from(METHODS), maybe(small_ints),
    maybe(st.sampled_from(["Inferact/Kimi-K3-DSpark", "x/eagle3"])), maybe(st.integers(0, 12)),
    maybe(st.integers(0, 12)), maybe(st.booleans()), maybe(st.booleans()), st.sampled_from(["mxfp4", "nvfp4", "fp8"]),
    st.sampled_from([{"pvc": {"claimName": "w"}}, {"hostPath": {"path": "/models/k3"}}, {"hub": {}}, {},
                     {"pvc": {"claimName": "w"}, "hub": {}}]),
    maybe(st.lists(st.sampled_from(["--max-log-len=10", "--tensor_parallel_size=2", "--seed", "1",
                                    "--speculative-config.num_speculative_tokens=3", "--api_key.x=sk", "--api-key",
                                    "--api-keys=1"]), max_size=3)),
    maybe(st.integers(-1, 5)), maybe(st.sampled_from(["fp8", "auto", "int4"])), maybe(st.sampled_from([0.9, 0.3, 1.5])))
specs = st.one_of(plausible(), hostile)


def outcome(spec: dict[str, Any]) -> tuple[Admitted | None, list[str]]:
    """(what admission returned or None, refusal paths). Any exception other than SpecErrors fails the test."""
    try:
        return admit(spec), []
    except SpecErrors as exc:
        assert exc.errors, "a refusal must list problems"
        for err in exc.errors:
            assert err.path.startswith("spec"), err
            assert err.message.strip(), err
        return None, [e.path for e in exc.errors]


@settings(max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs)
def test_admission_never_crashes_and_what_it_admits_renders(spec):
    admitted, _ = outcome(spec)
    if admitted is not None:
        rendered = render(admitted, Owner("p", "ns", "u"))
        kinds = [o["kind"] for o in rendered.objects]
        assert "LeaderWorkerSet" in kinds and "ConfigMap" in kinds and "Service" in kinds
        plan = json.loads(next(o for o in rendered.objects if o["kind"] == "ConfigMap")["data"]["plan.json"])
        assert len(plan["ranks"]) == admitted.plan.nodes_per_group


def dry_run(kube, namespace: str, spec: dict[str, Any]) -> tuple[bool, str]:
    body = {"apiVersion": "inference.kimik3.io/v1alpha1", "kind": "KimiK3Deployment",
            "metadata": {"name": "prop", "namespace": namespace}, "spec": copy.deepcopy(spec)}
    try:
        kube.request("POST", f"/apis/inference.kimik3.io/v1alpha1/namespaces/{namespace}/kimik3deployments",
                     body=body, query=[("dryRun", "All"), ("fieldValidation", "Strict")])
        return True, ""
    except ApiError as exc:
        assert exc.status in (400, 422), exc.body
        return False, exc.body


@pytest.fixture(scope="module")
def prop_namespace(admin_api):
    from kubernetes import client
    name = "props"
    try:
        client.CoreV1Api(admin_api).create_namespace({"metadata": {"name": name}})
    except ApiException as exc:
        if exc.status != 409:
            raise
    return name


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(specs)
def test_api_server_and_operator_agree(kube, prop_namespace, spec):
    api_ok, body = dry_run(kube, prop_namespace, spec)
    admitted, paths = outcome(spec)
    if admitted is not None:
        assert api_ok, f"the operator admits what the API server refuses: {body[:600]}"
    if not api_ok:
        causes = json.loads(body).get("details", {}).get("causes", [])
        assert causes or "spec" in json.loads(body).get("message", ""), body[:400]
