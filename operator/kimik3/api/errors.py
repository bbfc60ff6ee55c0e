"""Spec problems as (field path, message) pairs, collected so a user sees every one at once."""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import ValidationError
from pydantic.alias_generators import to_camel

from kimik3.api.v1alpha1 import PATTERN_MEANINGS


@dataclass(frozen=True)
class SpecError:
    """One problem: ``path`` is the field path as the user wrote it (``spec.topology.dataParallelSize``)."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


class SpecErrors(ValueError):
    """Every problem found in one spec."""

    def __init__(self, errors: list[SpecError]):
        self.errors = errors
        super().__init__("; ".join(map(str, errors)))


def from_validation_error(exc: ValidationError, prefix: str = "spec") -> list[SpecError]:
    """Pydantic errors as SpecErrors with camelCase field paths (``spec.engine.maxNumSeqs``)."""
    out = []
    for err in exc.errors():
        parts = [prefix]
        for loc in err["loc"]:
            if isinstance(loc, int):
                parts[-1] += f"[{loc}]"
            else:
                parts.append(to_camel(loc) if "_" in loc else loc)
        message = err["msg"]
        if err["type"] == "extra_forbidden":
            message = "unknown field (check its spelling and nesting; `kubectl explain kimik3deployment.spec` lists the fields)"
        elif err["type"] == "string_pattern_mismatch" and err.get("ctx", {}).get("pattern") in PATTERN_MEANINGS:
            message = f"{err['input']!r} is not {PATTERN_MEANINGS[err['ctx']['pattern']]}"
        out.append(SpecError(".".join(parts), message))
    return out
