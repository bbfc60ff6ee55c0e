"""Rollouts: a surge that can move, a Recreate without surge settings, canary groups that are surge groups.

With strategy Surge a template change creates up to ``maxSurge`` groups in a new LeaderWorkerSet
beyond replicas and takes at most ``maxUnavailable`` old groups down at once
(``controller.fleet``); both 0 would never replace a group. Canary groups are those surge groups
(every old group serves during the bake), so there cannot be more of them than ``maxSurge``. A
progress deadline shorter than the load budget would roll back a healthy group still loading.
"""

from __future__ import annotations

from kimik3.admission.rules import Candidate, Rule, Table, example, refuse
from kimik3.api.errors import SpecError
from kimik3.api.v1alpha1 import duration_seconds

PATH = "spec.rollout"


def surge_moves(c: Candidate) -> list[SpecError]:
    r = c.spec.rollout
    return refuse(r.strategy == "Surge" and r.surge + (r.unavailable or 0) < 1, f"{PATH}.maxSurge",
                  "strategy Surge with maxSurge 0 and maxUnavailable 0 can never replace a group: raise one of them")


def recreate_plain(c: Candidate) -> list[SpecError]:
    r = c.spec.rollout
    given = [name for name, value in (("maxSurge", r.max_surge), ("maxUnavailable", r.max_unavailable),
                                      ("canary", r.canary)) if value is not None]
    return refuse(r.strategy == "Recreate" and bool(given), f"{PATH}.strategy",
                  f"strategy Recreate replaces every group at once: it takes no {', '.join(given)}")


def canary_within_surge(c: Candidate) -> list[SpecError]:
    r = c.spec.rollout
    return refuse(r.canary is not None and r.strategy == "Surge" and r.canary.groups > r.surge,
                  f"{PATH}.canary.groups",
                  f"canary.groups are surge groups beside every old group: raise maxSurge ({r.surge}) to at "
                  f"least canary.groups ({r.canary.groups if r.canary else 0})")


def deadline_covers_load(c: Candidate) -> list[SpecError]:
    r, load = c.spec.rollout, c.spec.probes.load_timeout
    return refuse(r.progress_deadline is not None and duration_seconds(r.progress_deadline) < duration_seconds(load),
                  f"{PATH}.progressDeadline",
                  f"rollout.progressDeadline ({r.progress_deadline}) is shorter than probes.loadTimeout ({load}): a "
                  "healthy group that takes its whole load budget would be rolled back; raise progressDeadline to at "
                  "least loadTimeout, or leave it unset")


ROLLOUT = Table("rollout", (
    Rule(surge_moves, example(rollout={"maxSurge": 0, "maxUnavailable": 0}), cel=("rollout-surge-moves",)),
    Rule(recreate_plain, example(rollout={"strategy": "Recreate", "maxSurge": 1}), cel=("rollout-recreate-plain",)),
    Rule(canary_within_surge, example(rollout={"maxSurge": 1, "canary": {"groups": 2}}),
         cel=("rollout-canary-within-surge",)),
    Rule(deadline_covers_load, example(rollout={"progressDeadline": "30m"}, probes={"loadTimeout": "90m"}),
         cel=("rollout-deadline-covers-load",)),
))
