"""Generate the KimiK3Deployment CustomResourceDefinition from the pydantic models.

``crd_manifest()`` returns the CRD as a dict; ``kimik3 crd`` writes it to ``crds/``. The OpenAPI
v3 schema is structural (every node typed, refs inlined, no titles), descriptions come from the
models' field docstrings, and the models' CEL rules become ``x-kubernetes-validations``.
"""

from __future__ import annotations

import copy
from typing import Any

from pydantic import BaseModel

from kimik3.kube.kinds import GROUP, KIND, PLURAL, VERSION
from kimik3.api.conditions import ConditionType
from kimik3.api.v1alpha1 import KimiK3DeploymentSpec, KimiK3DeploymentStatus

SHORT_NAMES = ["k3d", "kimik3"]
CATEGORIES = ["inference", "all"]

_DROP = {"title"}


def _resolve(node: Any, defs: dict[str, Any]) -> Any:
    """Inline ``$ref``s, collapse ``Optional[X]`` to X, drop titles, keep everything else."""
    if isinstance(node, list):
        return [_resolve(n, defs) for n in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = copy.deepcopy(defs[node["$ref"].rsplit("/", 1)[-1]])
        extra = {k: v for k, v in node.items() if k != "$ref"}
        target.update(extra)
        return _resolve(target, defs)
    if "anyOf" in node and sorted(v.get("type", "") for v in node["anyOf"]) == ["integer", "string"]:
        rest = {k: v for k, v in node.items() if k != "anyOf"}
        return {**_resolve(rest, defs), "x-kubernetes-int-or-string": True}
    if "anyOf" in node:
        variants = [v for v in node["anyOf"] if v.get("type") != "null"]
        if len(variants) == 1:
            merged = {k: v for k, v in node.items() if k != "anyOf"}
            merged = {**_resolve(variants[0], defs), **{k: v for k, v in merged.items()}}
            if merged.get("default", "absent") is None:
                del merged["default"]
            return _resolve(merged, defs)
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROP or key == "$defs":
            continue
        if key == "properties":
            out[key] = {name: _resolve(sub, defs) for name, sub in value.items()}
        elif key == "const":
            out["enum"] = [value]
        else:
            out[key] = _resolve(value, defs)
    if "enum" in out and "type" not in out:
        out["type"] = "string"
    if out.get("type") == "object" and "properties" in out:
        out.setdefault("additionalProperties", None)
        if out["additionalProperties"] in (None, False):
            del out["additionalProperties"]
    return out


def _default_nested_objects(schema: dict[str, Any], model: type[BaseModel]) -> None:
    """Give sub-objects built by a default factory their full default value (pydantic leaves
    factory defaults out of the JSON schema; the API server checks a default against the CEL
    rules as written, without filling nested defaults, so ``{}`` would not do)."""
    for name, field in model.model_fields.items():
        alias = field.alias or name
        prop = schema.get("properties", {}).get(alias)
        if prop is None:
            continue
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            if field.default_factory is not None:
                prop["default"] = annotation().model_dump(by_alias=True, exclude_none=True, mode="json")
            _default_nested_objects(prop, annotation)


def model_schema(model: type[BaseModel]) -> dict[str, Any]:
    """Structural OpenAPI v3 schema of a pydantic model, as the CRD carries it."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    schema: dict[str, Any] = _resolve(raw, raw.get("$defs", {}))
    _default_nested_objects(schema, model)
    return schema


def _printer_columns() -> list[dict[str, Any]]:
    return [
        {"name": "Ready", "type": "string",
         "jsonPath": f'.status.conditions[?(@.type=="{ConditionType.READY}")].status'},
        {"name": "Replicas", "type": "integer", "jsonPath": ".status.replicas",
         "description": "Engine groups that exist"},
        {"name": "Revision", "type": "string", "jsonPath": ".status.rollout.updateRevision",
         "description": "The revision of the group templates being rolled out (all groups' once done)"},
        {"name": "Updated", "type": "integer", "jsonPath": ".status.rollout.updatedReadyReplicas",
         "description": "Groups Ready on that revision"},
        {"name": "Accelerator", "type": "string", "jsonPath": ".spec.topology.accelerator"},
        {"name": "Endpoint", "type": "string", "jsonPath": ".status.endpoint"},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ]


def crd_manifest() -> dict[str, Any]:
    """The KimiK3Deployment CRD (apiextensions.k8s.io/v1) as a dict."""
    spec_schema = model_schema(KimiK3DeploymentSpec)
    spec_schema["description"] = (KimiK3DeploymentSpec.__doc__ or "").strip()
    status_schema = model_schema(KimiK3DeploymentStatus)
    status_schema["description"] = (KimiK3DeploymentStatus.__doc__ or "").strip()
    # Conditions are keyed by type (Kubernetes API conventions: a map-list).
    conditions = status_schema["properties"]["conditions"]
    conditions["x-kubernetes-list-type"] = "map"
    conditions["x-kubernetes-list-map-keys"] = ["type"]
    root = {
        "type": "object",
        "description": "A Kimi K3 inference deployment: engine groups of vLLM placed on NVLink domains, "
        "with a client Service, a disruption budget, monitoring and decode-latency autoscaling.",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec_schema,
            "status": status_schema,
        },
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": KIND.lower(),
                "shortNames": SHORT_NAMES,
                "categories": CATEGORIES,
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": root},
                    "subresources": {
                        "status": {},
                        "scale": {
                            "specReplicasPath": ".spec.replicas",
                            "statusReplicasPath": ".status.replicas",
                            "labelSelectorPath": ".status.selector",
                        },
                    },
                    "additionalPrinterColumns": _printer_columns(),
                }
            ],
        },
    }
