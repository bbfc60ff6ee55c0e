"""The rendered LeaderWorkerSet carries no rolloutStrategy (its templates never change once it
exists: ``controller.fleet`` rolls a change through a new one), and the admission rules of
spec.rollout.
"""

from __future__ import annotations

import pytest

from kimik3.admission import admit
from kimik3.api.errors import SpecErrors
from support.recipes import recipe
from support.rendering import by_kind, render_cr

UID = "7a1c2b9e-0000-4000-8000-000000000012"


@pytest.mark.parametrize("rollout", [{}, {"maxSurge": 2}, {"strategy": "Recreate"}, {"canary": {"groups": 1}}])
def test_the_leaderworkerset_has_no_rollout_strategy(rollout):
    lws = by_kind(render_cr(recipe(uid=UID, replicas=3, rollout=rollout)).objects, "LeaderWorkerSet")
    assert "rolloutStrategy" not in lws["spec"] and lws["spec"]["replicas"] == 3


@pytest.mark.parametrize("rollout,path,words", [
    ({"maxSurge": 0, "maxUnavailable": 0}, "spec.rollout.maxSurge", "can never replace a group"),
    ({"strategy": "Recreate", "maxUnavailable": 2}, "spec.rollout.strategy", "it takes no maxUnavailable"),
    ({"strategy": "Recreate", "canary": {}}, "spec.rollout.strategy", "it takes no canary"),
    ({"maxSurge": 2, "canary": {"groups": 3}}, "spec.rollout.canary.groups",
     "raise maxSurge (2) to at least canary.groups (3)"),
])
def test_rollout_refusals_name_the_field_and_the_fix(rollout, path, words):
    with pytest.raises(SpecErrors) as refused:
        admit(recipe(rollout=rollout)["spec"])
    (error,) = refused.value.errors
    assert error.path == path and words in error.message


def test_canary_durations_in_seconds_and_the_latency_defaults_to_the_target():
    seconds = admit(recipe(rollout={"canary": {"bake": "15m", "analysis": {"interval": "30s"}}},
                           autoscaling={"target": {"value": "4ms"}})["spec"]).seconds
    assert (seconds.canary_bake, seconds.canary_interval, seconds.canary_max_latency) == (900.0, 30.0, 0.004)
    given = admit(recipe(rollout={"canary": {"analysis": {"maxLatency": "6ms"}}})["spec"]).seconds
    assert given.canary_max_latency == 0.006
    assert admit(recipe()["spec"]).seconds.canary_bake is None
