"""Everything a KimiK3Deployment spec must pass before the operator renders it.

``admit(spec_dict)`` parses the spec (schema), derives the group plan (shape, memory, megakernel
and speculative-decoding constraints) and checks ``extraArgs`` against the flags the operator
owns, and applies the cluster's ``AdmissionPolicy`` (which node folders a spec may mount). It
returns the parsed spec and plan, or raises ``SpecErrors`` with every problem found, each with
its field path, so ``kimik3 validate`` and the controller report them all at once.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from kimik3.api.errors import SpecError, SpecErrors, from_validation_error
from kimik3.api.v1alpha1 import KimiK3DeploymentSpec
from kimik3.engine.args import check_extra_args, check_plain_text_keys
from kimik3.topology.plan import GroupPlan, plan_group


DEFAULT_HOST_PATH_PREFIXES = ("/models", "/mnt", "/raid", "/data")
"""Node folders weights may be pre-staged in by default: common local-disk mounts of GPU nodes
(``/raid`` on DGX systems). A platform team sets its own with ``kimik3 run --allowed-host-path``."""


@dataclass(frozen=True)
class AdmissionPolicy:
    """What the cluster's operator allows beyond the schema (set by the platform team)."""

    allowed_host_paths: tuple[str, ...] = DEFAULT_HOST_PATH_PREFIXES
    """A hostPath weight source must be one of these folders or below one."""


def check_host_path(parsed: KimiK3DeploymentSpec, policy: AdmissionPolicy) -> list[SpecError]:
    """Refuse a hostPath outside the allowed folders (or not in normal form, e.g. with ``..``):
    a CR must not mount arbitrary node paths into pods."""
    source = parsed.model.source.host_path
    if source is None:
        return []
    path = source.path
    normal = posixpath.normpath(path)
    inside = any(normal == p or normal.startswith(p.rstrip("/") + "/") for p in policy.allowed_host_paths)
    if normal != path.rstrip("/") or not inside:
        allowed = ", ".join(policy.allowed_host_paths) or "none (hostPath is disabled)"
        return [SpecError("spec.model.source.hostPath.path",
                          f"{path} is outside the node folders this cluster allows for weights ({allowed}): "
                          "use a folder below one of them, or a pvc source")]
    return []


@dataclass(frozen=True)
class Admitted:
    """A spec that passed every rule: what render, status, the autoscaler, the simulator and the
    benchmark take (computed once per reconcile)."""

    spec: KimiK3DeploymentSpec
    """The parsed spec (defaults filled in)."""
    plan: GroupPlan
    """The parallel plan of one engine group."""


def admit(spec: dict[str, Any], policy: AdmissionPolicy = AdmissionPolicy()) -> Admitted:
    """Parse and check a spec. Raises SpecErrors listing every problem with its field path."""
    try:
        parsed = KimiK3DeploymentSpec.model_validate(spec)
    except ValidationError as exc:
        raise SpecErrors(from_validation_error(exc)) from None
    errors: list[SpecError] = check_extra_args(parsed) + check_plain_text_keys(parsed) + \
        check_host_path(parsed, policy)
    try:
        plan = plan_group(parsed)
    except SpecErrors as exc:
        errors = exc.errors + errors
        plan = None
    if errors:
        raise SpecErrors(errors)
    assert plan is not None
    return Admitted(parsed, plan)
