"""What one admission rule is: a Python check, the CEL rules it mirrors, and a spec it refuses.

Each concern's module (``shape``, ``memory``, ``speculative``, ...) declares one ``Table`` of
``Rule`` rows (``SHAPE``, ``MEMORY``, ``SPECULATIVE``, ...). A row pairs the check the operator runs (for ``kimik3 validate`` and every
reconcile) with the names of the CEL rules in the CRD that refuse the same specs on the API
server (``kimik3.api.v1alpha1.CEL_RULES``), or, for a rule only the operator can apply, says why
CEL cannot express it. ``refuses`` is a spec both sides refuse: tests/test_admission_tables.py
sends it to a real API server and through the check.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kimik3.api.errors import SpecError
from kimik3.api.v1alpha1 import KimiK3DeploymentSpec, TopologySpec

DEFAULT_HOST_PATH_PREFIXES = ("/models", "/mnt", "/raid", "/data")
"""Node folders weights may be pre-staged in by default: common local-disk mounts of GPU nodes
(``/raid`` on DGX systems). A platform team sets its own with ``kimik3 run --allowed-host-path``."""


@dataclass(frozen=True)
class AdmissionPolicy:
    """What the cluster's operator allows beyond the schema (set by the platform team)."""

    allowed_host_paths: tuple[str, ...] = DEFAULT_HOST_PATH_PREFIXES
    """A hostPath weight source must be one of these folders or below one."""


@dataclass(frozen=True)
class Candidate:
    """What every check reads: a spec the schema accepted, and the cluster's policy."""

    spec: KimiK3DeploymentSpec
    policy: AdmissionPolicy = AdmissionPolicy()

    @property
    def topology(self) -> TopologySpec:
        """``spec.topology``, which most checks read."""
        return self.spec.topology


Check = Callable[[Candidate], list[SpecError]]
"""A check: every problem it finds, each with its field path (empty when the spec passes)."""


@dataclass(frozen=True)
class Rule:
    """One row of a concern's table."""

    check: Check
    refuses: dict[str, Any]
    """A spec (camelCase, as in a CR) this check refuses, and its CEL twins refuse too."""
    cel: tuple[str, ...] = ()
    """Names of the CEL rules (``CEL_RULES``) that refuse on the API server what this check refuses."""
    operator_only: str = ""
    """Why no CEL rule can express this check; set exactly when ``cel`` is empty."""

    def __post_init__(self) -> None:
        if bool(self.cel) == bool(self.operator_only):
            raise ValueError(f"{self.name}: name its CEL twins or say why it is operator-only, not both")

    @property
    def name(self) -> str:
        return self.check.__name__


def refuse(when: bool, path: str, message: str) -> list[SpecError]:
    """``[SpecError(path, message)]`` when ``when``, else no problem: the shape of most checks."""
    return [SpecError(path, message)] if when else []


def example(**fields: Any) -> dict[str, Any]:
    """A spec with weights on a PVC and ``fields`` (camelCase top-level fields) set."""
    return {"model": {"source": {"pvc": {"claimName": "weights"}}}, **fields}


@dataclass(frozen=True)
class Table:
    """The rules of one concern, in the order their problems are reported."""

    concern: str
    rules: tuple[Rule, ...]

    def errors(self, candidate: Candidate) -> list[SpecError]:
        return [e for r in self.rules for e in r.check(candidate)]
