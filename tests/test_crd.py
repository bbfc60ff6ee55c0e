"""The KimiK3Deployment CRD generated from the pydantic models (``kimik3.api.crd.crd_manifest``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from kimik3.api.crd import crd_manifest
from kimik3.cli import CRD_FILE, dump_crd

REPO = Path(__file__).resolve().parents[1]
COMMITTED = REPO / "crds" / "inference.kimik3.io_kimik3deployments.yaml"


@pytest.fixture(scope="module")
def crd() -> dict[str, Any]:
    return crd_manifest()


def version(crd: dict[str, Any]) -> dict[str, Any]:
    (v,) = crd["spec"]["versions"]
    return v


def root_schema(crd: dict[str, Any]) -> dict[str, Any]:
    return version(crd)["schema"]["openAPIV3Schema"]


def schema_nodes(node: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every schema node under ``node`` (properties, items, additionalProperties), with its path."""
    yield path, node
    for name, sub in (node.get("properties") or {}).items():
        yield from schema_nodes(sub, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        yield from schema_nodes(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from schema_nodes(node["additionalProperties"], f"{path}{{}}")


def test_committed_crd_is_the_generated_one():
    assert COMMITTED.name == CRD_FILE
    generated = dump_crd(crd_manifest())
    committed = COMMITTED.read_text(encoding="utf-8")
    assert generated == committed, (
        f"{COMMITTED.relative_to(REPO)} is stale: the models changed. Run `tools/kimik3 crd` and commit the result.")


def test_committed_crd_parses_to_the_manifest(crd):
    assert yaml.safe_load(COMMITTED.read_text(encoding="utf-8")) == crd


def test_names_scope_and_version(crd):
    assert crd["apiVersion"] == "apiextensions.k8s.io/v1"
    assert crd["metadata"]["name"] == "kimik3deployments.inference.kimik3.io"
    assert crd["spec"]["group"] == "inference.kimik3.io"
    assert crd["spec"]["scope"] == "Namespaced"
    names = crd["spec"]["names"]
    assert (names["kind"], names["listKind"], names["plural"], names["singular"]) == \
        ("KimiK3Deployment", "KimiK3DeploymentList", "kimik3deployments", "kimik3deployment")
    v = version(crd)
    assert (v["name"], v["served"], v["storage"]) == ("v1alpha1", True, True)


def test_schema_is_structural(crd):
    untyped, forbidden = [], []
    for path, node in schema_nodes(root_schema(crd)):
        if node.get("x-kubernetes-int-or-string"):
            if "type" in node:
                forbidden.append(f"{path}: type with x-kubernetes-int-or-string")
        elif "type" not in node:
            untyped.append(path or "<root>")
        for key in ("$ref", "$defs", "anyOf", "oneOf", "allOf", "title"):
            if key in node:
                forbidden.append(f"{path}: {key}")
    assert untyped == [], f"schema nodes without type: {untyped}"
    assert forbidden == [], forbidden


def test_no_ref_anywhere_in_the_manifest():
    text = dump_crd(crd_manifest())
    assert "$ref" not in text and "anyOf" not in text and "title:" not in text


def test_every_spec_field_has_a_description(crd):
    spec = root_schema(crd)["properties"]["spec"]
    missing = [path for path, node in schema_nodes(spec, "spec") if path != "spec" and "." in path
               and not path.endswith(("[]", "{}")) and not node.get("description")]
    assert missing == [], f"fields without description (kubectl explain shows nothing): {missing}"


def test_spec_is_required_and_typed_objects(crd):
    root = root_schema(crd)
    assert root["required"] == ["spec"]
    assert root["properties"]["spec"]["type"] == "object"
    assert root["properties"]["status"]["type"] == "object"


def test_scale_and_status_subresources(crd):
    sub = version(crd)["subresources"]
    assert sub["status"] == {}
    assert sub["scale"] == {"specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas",
                            "labelSelectorPath": ".status.selector"}
    status = root_schema(crd)["properties"]["status"]["properties"]
    assert status["replicas"]["type"] == "integer"
    assert status["selector"]["type"] == "string"
    assert root_schema(crd)["properties"]["spec"]["properties"]["replicas"]["type"] == "integer"


def test_printer_columns(crd):
    columns = version(crd)["additionalPrinterColumns"]
    assert [(c["name"], c["type"], c["jsonPath"]) for c in columns] == [
        ("Ready", "string", '.status.conditions[?(@.type=="Ready")].status'),
        ("Replicas", "integer", ".status.replicas"),
        ("Revision", "string", ".status.rollout.updateRevision"),
        ("Updated", "integer", ".status.rollout.updatedReadyReplicas"),
        ("Accelerator", "string", ".spec.topology.accelerator"),
        ("Endpoint", "string", ".status.endpoint"),
        ("Age", "date", ".metadata.creationTimestamp"),
    ]


def test_conditions_are_a_map_list_keyed_by_type(crd):
    conditions = root_schema(crd)["properties"]["status"]["properties"]["conditions"]
    assert conditions["x-kubernetes-list-type"] == "map"
    assert conditions["x-kubernetes-list-map-keys"] == ["type"]
    assert "type" in conditions["items"]["required"]


def test_min_available_is_int_or_string(crd):
    node = root_schema(crd)["properties"]["spec"]["properties"]["disruptionBudget"]["properties"]["minAvailable"]
    assert node["x-kubernetes-int-or-string"] is True
    assert node["default"] == "75%"


def test_spec_cel_rules_cover_megakernel_and_dspark(crd):
    rules = root_schema(crd)["properties"]["spec"]["x-kubernetes-validations"]
    paths = {r.get("fieldPath") for r in rules}
    assert {".engine.decodeBackend", ".speculativeDecoding.method", ".topology"} <= paths
    assert all(r["rule"] and r["message"] for r in rules)
