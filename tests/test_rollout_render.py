"""spec.rollout as the LeaderWorkerSet's rolloutStrategy, and the admission rules of spec.rollout.

The strategies are read in LWS v0.9.0's controller (``render/revision.py``): Surge renders
``maxSurge`` S and ``maxUnavailable`` U (defaults 1 and 0), Recreate ``maxUnavailable: 100%`` and
no surge; a partition only when the rollout controller holds one.
"""

from __future__ import annotations

import pytest

from kimik3.admission import admit
from kimik3.api.errors import SpecErrors
from kimik3.render.leaderworkerset import leader_worker_set
from kimik3.render.meta import Owner
from support.recipes import recipe
from support.rendering import by_kind, render_cr

UID = "7a1c2b9e-0000-4000-8000-000000000012"


def strategy(**rollout) -> dict:
    lws = by_kind(render_cr(recipe(uid=UID, replicas=3, rollout=rollout)).objects, "LeaderWorkerSet")
    return lws["spec"]["rolloutStrategy"]


@pytest.mark.parametrize("rollout,config", [
    ({}, {"maxSurge": 1, "maxUnavailable": 0}),
    ({"maxSurge": 2}, {"maxSurge": 2, "maxUnavailable": 0}),
    ({"maxSurge": 0, "maxUnavailable": 1}, {"maxSurge": 0, "maxUnavailable": 1}),
    ({"maxSurge": 1, "maxUnavailable": 5}, {"maxSurge": 1, "maxUnavailable": 2}),  # never the last group
    ({"maxSurge": 1, "canary": {"groups": 1}}, {"maxSurge": 1, "maxUnavailable": 0}),
    ({"strategy": "Recreate"}, {"maxSurge": 0, "maxUnavailable": "100%"}),
])
def test_rollout_strategy_of_the_spec(rollout, config):
    assert strategy(**rollout) == {"type": "RollingUpdate", "rollingUpdateConfiguration": config}


def test_one_group_with_a_surge_is_never_taken_down():
    lws = by_kind(render_cr(recipe(uid=UID, replicas=1, rollout={"maxUnavailable": 1})).objects, "LeaderWorkerSet")
    assert lws["spec"]["rolloutStrategy"]["rollingUpdateConfiguration"] == {"maxSurge": 1, "maxUnavailable": 0}


def test_a_partition_is_rendered_only_when_held():
    cr = recipe(uid=UID, replicas=3)
    admitted, owner = admit(cr["spec"]), Owner.from_object(cr)
    held = leader_worker_set(owner, admitted, 3, partition=3)["spec"]["rolloutStrategy"]
    assert held["rollingUpdateConfiguration"] == {"maxSurge": 1, "maxUnavailable": 0, "partition": 3}
    assert "partition" not in leader_worker_set(owner, admitted, 3)["spec"]["rolloutStrategy"][
        "rollingUpdateConfiguration"]


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
