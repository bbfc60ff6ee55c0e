"""Everything a KimiK3Deployment spec must pass before the operator renders it.

``admit(spec_dict)`` parses the spec (schema), derives the group plan (shape, memory, megakernel
and speculative-decoding constraints) and checks ``extraArgs`` against the flags the operator
owns. It returns the parsed spec and plan, or raises ``SpecErrors`` with every problem found, each
with its field path, so ``kimik3 validate`` and the controller report them all at once.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from kimik3.api.errors import SpecError, SpecErrors, from_validation_error
from kimik3.api.v1alpha1 import KimiK3DeploymentSpec
from kimik3.engine.args import check_extra_args
from kimik3.topology.plan import GroupPlan, plan_group


def admit(spec: dict[str, Any]) -> tuple[KimiK3DeploymentSpec, GroupPlan]:
    """Parse and check a spec. Raises SpecErrors listing every problem with its field path."""
    try:
        parsed = KimiK3DeploymentSpec.model_validate(spec)
    except ValidationError as exc:
        raise SpecErrors(from_validation_error(exc)) from None
    errors: list[SpecError] = check_extra_args(parsed)
    try:
        plan = plan_group(parsed)
    except SpecErrors as exc:
        errors = exc.errors + errors
        plan = None
    if errors:
        raise SpecErrors(errors)
    assert plan is not None
    return parsed, plan
