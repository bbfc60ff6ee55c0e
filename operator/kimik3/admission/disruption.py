"""The group-aware PodDisruptionBudget: ``minAvailable`` is a group count (>= 0) or a percentage.

The schema takes an int or a string matching ``^[0-9]{1,3}%$``; a negative count passes the
schema's type and is refused here (and by its CEL twin).
"""

from __future__ import annotations

from kimik3.admission.rules import Candidate, Rule, Table, example, refuse
from kimik3.api.errors import SpecError


def min_available_count_or_percentage(c: Candidate) -> list[SpecError]:
    value = c.spec.disruption_budget.min_available
    return refuse(isinstance(value, int) and value < 0, "spec.disruptionBudget.minAvailable",
                  "a group count (>= 0) or a percentage such as 75%")


DISRUPTION = Table("disruption", (
    Rule(min_available_count_or_percentage, example(disruptionBudget={"minAvailable": -1}),
         cel=("min-available-count-or-percent",)),
))
