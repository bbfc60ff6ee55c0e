"""A ValidatingAdmissionPolicy: a KimiK3Deployment may name only Secrets its author may read.

The operator never reads Secret values: it puts ``secretKeyRef`` env entries into the engine pods
and the kubelet resolves them. Without a check, a tenant allowed to create KimiK3Deployments but
not to read a Secret could have the operator mount it into a pod. The policy closes that: on
create and update, for every field typed ``SecretKeyRef`` in the models, the API server asks its
authorizer whether the requesting user may ``get`` that Secret in the CR's namespace, and denies
the request otherwise (reason Forbidden, with the field path). The fields are found by walking
the pydantic models, so a new Secret reference is covered by regenerating ``crds/``.
"""

from __future__ import annotations

import typing
from typing import Any

from pydantic import BaseModel

from kimik3.kube.kinds import GROUP, PLURAL, VERSION
from kimik3.api.v1alpha1 import KimiK3DeploymentSpec, SecretKeyRef

POLICY_NAME = "kimik3-secret-references"


def _model_of(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_of(arg)
        if found is not None:
            return found
    return None


def secret_reference_paths(model: type[BaseModel] = KimiK3DeploymentSpec,
                           prefix: tuple[str, ...] = ("spec",)) -> list[tuple[str, ...]]:
    """Field paths (camelCase segments) of every SecretKeyRef under ``model``."""
    out = []
    for name, field in model.model_fields.items():
        sub = _model_of(field.annotation)
        if sub is None:
            continue
        path = (*prefix, field.alias or name)
        if sub is SecretKeyRef:
            out.append(path)
        else:
            out += secret_reference_paths(sub, path)
    return out


def _validation(path: tuple[str, ...]) -> dict[str, str]:
    obj = "object." + ".".join(path)
    presence = " && ".join(f"has(object.{'.'.join(path[:i])})" for i in range(2, len(path) + 1))
    check = (f"authorizer.group('').resource('secrets').namespace(object.metadata.namespace)"
             f".name({obj}.name).check('get').allowed()")
    # An update that keeps the reference as it was (the operator's finalizer patch, a label, a
    # scale) is not checked again: its author adds no Secret, and the operator itself may not read
    # Secrets (its RBAC has no `get secrets`), so checking it would block every such CR.
    old = "oldObject." + ".".join(path)
    old_presence = " && ".join(f"has(oldObject.{'.'.join(path[:i])})" for i in range(2, len(path) + 1))
    unchanged = f"(oldObject != null && {old_presence} && {old}.name == {obj}.name)"
    return {
        "expression": f"!({presence}) || {unchanged} || {check}",
        "messageExpression": (f"'{'.'.join(path)}: you may not get Secret ' + {obj}.name + ' in namespace ' + "
                              "object.metadata.namespace + ', so this KimiK3Deployment may not reference it'"),
        "reason": "Forbidden",
    }


def secret_policy_manifests() -> list[dict[str, Any]]:
    """The ValidatingAdmissionPolicy and its binding (admissionregistration.k8s.io/v1)."""
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": POLICY_NAME},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{
                "apiGroups": [GROUP], "apiVersions": [VERSION], "operations": ["CREATE", "UPDATE"],
                "resources": [PLURAL]}]},
            "validations": [_validation(p) for p in secret_reference_paths()],
        },
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": POLICY_NAME},
        "spec": {"policyName": POLICY_NAME, "validationActions": ["Deny"]},
    }
    return [policy, binding]
