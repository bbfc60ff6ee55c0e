"""The latency reaction alone (autoscaler/policy/reaction.py): one more group over the tolerated
quantile, only with nothing loading, unplaceable or just joined; and the scale-down anchored on
the observed quantile. Target 5 ms; the test model is 2.5 ms + 0.05 ms per request."""

from __future__ import annotations

import pytest

from kimik3.autoscaler.policy.interface import FleetState
from kimik3.autoscaler.policy.model import GroupLatencyModel
from kimik3.autoscaler.policy.reaction import REACT_TOLERANCE, anchored_down, over_target, tolerated
from tests.test_autoscaler_policy import TARGET

TWO = FleetState(current=2, ready=2)


def test_the_tolerance_is_hpas_ten_percent():
    assert REACT_TOLERANCE == 0.1
    assert tolerated(TARGET) == pytest.approx(0.0055)


def test_over_the_tolerated_quantile_one_more_group_is_due_when_the_model_adds_none():
    assert over_target(0.006, TARGET, 2, TWO, joined=False)
    assert over_target(0.006, TARGET, 1, TWO, joined=False)  # the model would even remove one
    assert not over_target(0.0052, TARGET, 2, TWO, joined=False)  # within the tolerance: noise
    assert not over_target(tolerated(TARGET), TARGET, 2, TWO, joined=False)
    assert not over_target(None, TARGET, 2, TWO, joined=False)
    assert not over_target(0.006, TARGET, 3, TWO, joined=False)  # the model already adds one


def test_no_reaction_while_groups_load_wait_for_a_place_or_just_joined():
    assert not over_target(0.006, TARGET, 2, FleetState(current=3, ready=2, loading=1), joined=False)
    assert not over_target(0.006, TARGET, 2, FleetState(current=3, ready=2, unplaceable=1), joined=False)
    assert not over_target(0.006, TARGET, 2, TWO, joined=True)


def test_scale_down_is_anchored_on_the_observed_quantile():
    """The model says 3 of 4 groups do at 20000 tok/s (3.85 ms with the 0.7 margin), but 4 are
    observed at 4.8 ms: the model's step from 4 to 3 on top of that passes the target."""
    m = GroupLatencyModel(t0=0.0025, k=0.00005)
    step = m.predict(20_000, 3, 0.7) - m.predict(20_000, 4)
    assert m.predict(20_000, 3, 0.7) < TARGET < 0.0048 + step
    assert anchored_down(3, 4, 0.0048, m, 20_000, 20_000, 0.7, TARGET) == 4
    assert anchored_down(3, 4, 0.0034, m, 20_000, 20_000, 0.7, TARGET) == 3
    assert anchored_down(2, 4, 0.0034, m, 20_000, 20_000, 0.7, TARGET) == 3  # from 2 the step is too large
    # The step ends at the demand to keep: a rising one (30000 tok/s) keeps all 4.
    assert anchored_down(3, 4, 0.0034, m, 20_000, 30_000, 0.7, TARGET) == 4
    assert anchored_down(5, 4, 0.0100, m, 20_000, 20_000, 0.7, TARGET) == 5  # not fewer than serve: untouched
