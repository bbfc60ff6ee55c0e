"""Canary bake, promotion and rollback (``controller.rollout.Rollouts``), step by step on one
reconcile's inputs: the stored status, the rendered and the live LeaderWorkerSet, the pods. The
analysis here returns given figures; tests/e2e/test_e2e_rollout.py reads them from the simulated
engines of a release made 2x slower."""

from __future__ import annotations

import copy

from kimik3.admission import admit
from kimik3.api.conditions import Reason
from kimik3.controller.canary import Analysis, Check
from kimik3.controller.rollout import Rollouts, scale_down_held
from kimik3.render.revision import TEMPLATE_HASH_ANNOTATION
from support.recipes import recipe
from support.rendering import by_kind, render_cr
from test_rollout_status import NEW, OLD, group

CANARY = {"groups": 1, "bake": "60s", "analysis": {"interval": "10s", "failureLimit": 2, "maxLatency": "5ms"}}


class Figures(Analysis):
    """Checks that return the next of ``results`` (passed, P90 seconds)."""

    def __init__(self, results):
        super().__init__(lambda pod, port: "")
        self.results = list(results)
        self.revisions: list[str] = []

    def check(self, namespace, name, admitted, revision, pods):
        self.revisions.append(revision)
        passed, latency = self.results.pop(0)
        verdict = "passed" if passed else "failed"
        return Check(passed, latency, 0.0, f"revision {revision} {verdict} a check: P90 {latency * 1000:.2f} ms")


class Clock:
    def __init__(self):
        self.now = 1_800_000_000.0

    def __call__(self):
        return self.now


def setup(image: str):
    cr = recipe(uid="u1", replicas=1, rollout={"canary": CANARY}, engine={"image": image})
    cr["metadata"]["generation"] = 2
    return cr, admit(cr["spec"]), by_kind(render_cr(cr).objects, "LeaderWorkerSet")


def live_of(lws):
    live = copy.deepcopy(lws)
    live["metadata"]["generation"] = 2
    return live


def remember(cr, step):
    cr["status"] = {"rollout": {"canary": step.canary.model_dump(by_alias=True) if step.canary else None,
                                "rolledBack": step.rolled_back.model_dump(by_alias=True) if step.rolled_back else None}}


def config(lws):
    return lws["spec"]["rolloutStrategy"]["rollingUpdateConfiguration"]


def test_a_slow_canary_is_rolled_back_and_held_back():
    _, _, old_lws = setup("vllm/vllm-openai:v0.33.0")
    live = live_of(old_lws)
    cr, admitted, new_lws = setup("vllm/vllm-openai:v0.33.1")
    clock, figures = Clock(), Figures([(False, 0.0104), (False, 0.0098)])
    rollouts = Rollouts(figures, clock)
    # the change: one canary group beside the old group; group 0 is not replaced (partition 1)
    step = rollouts.step(cr, admitted, new_lws, live, group(0, OLD, True))
    assert config(step.lws) == {"maxSurge": 1, "maxUnavailable": 0, "partition": 1}
    assert step.lws["spec"]["leaderWorkerTemplate"] == new_lws["spec"]["leaderWorkerTemplate"]
    assert [e[1] for e in step.events] == ["CanaryStarted"]
    assert step.verdict.reason == Reason.CANARY_ANALYSIS and "waiting for the canary group" in step.verdict.message
    remember(cr, step)
    live = copy.deepcopy(step.lws)
    # the canary group is Ready: the bake starts, the first check fails
    pods = group(0, OLD, True) + group(1, NEW, True)
    step = rollouts.step(cr, admitted, new_lws, live, pods)
    assert (step.canary.revision, step.canary.checks, step.canary.failed_checks) == (NEW, 1, 1)
    assert figures.revisions == [NEW]
    assert step.verdict.reason == Reason.CANARY_ANALYSIS and "1 failed (rollback at 2)" in step.verdict.message
    remember(cr, step)
    clock.now += 5  # within the interval: no check
    step = rollouts.step(cr, admitted, new_lws, live, pods)
    assert step.canary.checks == 1
    clock.now += 5
    step = rollouts.step(cr, admitted, new_lws, live, pods)
    # the second failure: the previous templates are back; LWS removes the canary group
    assert step.rolled_back is not None and step.rolled_back.revision == NEW
    assert step.rolled_back.restored_revision == OLD
    assert step.lws["spec"]["leaderWorkerTemplate"] == old_lws["spec"]["leaderWorkerTemplate"]
    assert step.lws["metadata"]["annotations"][TEMPLATE_HASH_ANNOTATION] == \
        old_lws["metadata"]["annotations"][TEMPLATE_HASH_ANNOTATION]
    assert "partition" not in config(step.lws)
    assert (step.verdict.status, step.verdict.reason) == ("False", Reason.ROLLED_BACK)
    assert "P90 9.80 ms" in step.verdict.message and "after 2 failed check(s) of 2" in step.verdict.message
    assert [e[:2] for e in step.events] == [("Warning", "RolledBack")]
    remember(cr, step)
    # while the spec still asks for the failed release, the groups keep the previous templates
    live = copy.deepcopy(step.lws)
    clock.now += 600
    step = rollouts.step(cr, admitted, new_lws, live, group(0, OLD, True))
    assert step.lws["spec"]["leaderWorkerTemplate"] == old_lws["spec"]["leaderWorkerTemplate"]
    assert step.verdict.reason == Reason.ROLLED_BACK and step.rolled_back is not None
    # a new edit rolls out again
    cr2, admitted2, newer = setup("vllm/vllm-openai:v0.33.2")
    cr2["status"] = cr["status"]
    step = rollouts.step(cr2, admitted2, newer, live, group(0, OLD, True))
    assert step.rolled_back is None and [e[1] for e in step.events] == ["CanaryStarted"]


def test_a_canary_that_passes_its_bake_is_promoted():
    _, _, old_lws = setup("vllm/vllm-openai:v0.33.0")
    cr, admitted, new_lws = setup("vllm/vllm-openai:v0.33.1")
    clock = Clock()
    rollouts = Rollouts(Figures([(True, 0.004)] * 7), clock)
    step = rollouts.step(cr, admitted, new_lws, live_of(old_lws), group(0, OLD, True))
    remember(cr, step)
    live = copy.deepcopy(step.lws)
    pods = group(0, OLD, True) + group(1, NEW, True)
    for _ in range(6):
        step = rollouts.step(cr, admitted, new_lws, live, pods)
        assert not step.canary.promoted and config(step.lws)["partition"] == 1
        remember(cr, step)
        clock.now += 10
    step = rollouts.step(cr, admitted, new_lws, live, pods)
    assert step.canary.promoted and step.canary.failed_checks == 0 and step.canary.checks == 7  # at 0, 10, .. 60 s
    assert config(step.lws) == {"maxSurge": 1, "maxUnavailable": 0}
    assert [e[1] for e in step.events] == ["CanaryPromoted"]
    remember(cr, step)
    step = rollouts.step(cr, admitted, new_lws, step.lws, pods)  # the LWS rolls the rest on its own
    assert config(step.lws) == {"maxSurge": 1, "maxUnavailable": 0} and step.verdict is None


def test_paused_holds_the_templates_and_every_group():
    _, _, old_lws = setup("vllm/vllm-openai:v0.33.0")
    cr, _, new_lws = setup("vllm/vllm-openai:v0.33.1")
    cr["spec"]["rollout"] = {"paused": True}
    admitted = admit(cr["spec"])
    step = Rollouts(Figures([]), Clock()).step(cr, admitted, new_lws, live_of(old_lws), group(0, OLD, True))
    assert step.lws["spec"]["leaderWorkerTemplate"] == old_lws["spec"]["leaderWorkerTemplate"]
    assert config(step.lws)["partition"] == 1
    assert step.verdict.reason == Reason.PAUSED and "a change of the group templates waits" in step.verdict.message


def test_a_restarted_operator_renders_the_same_leaderworkerset_mid_canary():
    """F16: the rollout keeps its memory in status.rollout, so a new operator (a fresh
    ``Rollouts``) renders the LeaderWorkerSet byte for byte as the old one did."""
    _, _, old_lws = setup("vllm/vllm-openai:v0.33.0")
    cr, admitted, new_lws = setup("vllm/vllm-openai:v0.33.1")
    clock = Clock()
    first = Rollouts(Figures([(True, 0.004)] * 3), clock)
    step = first.step(cr, admitted, new_lws, live_of(old_lws), group(0, OLD, True))
    remember(cr, step)
    live, pods = copy.deepcopy(step.lws), group(0, OLD, True) + group(1, NEW, True)
    step = first.step(cr, admitted, new_lws, live, pods)
    remember(cr, step)
    clock.now += 3
    again = first.step(cr, admitted, new_lws, live, pods).lws
    restarted = Rollouts(Figures([]), clock).step(cr, admitted, new_lws, live, pods).lws
    assert restarted == again and config(restarted)["partition"] == 1


def test_no_scale_down_mid_rollout_but_a_scale_up_or_a_lower_maximum_goes_ahead():
    lws = {"spec": {"replicas": 3}}
    assert scale_down_held(Reason.ROLLOUT_IN_PROGRESS, lws, 2, 4) == 3
    assert scale_down_held(Reason.CANARY_ANALYSIS, lws, 1, 4) == 3
    assert scale_down_held(Reason.SURGE_BLOCKED, lws, 1, 4) == 3
    assert scale_down_held(Reason.ROLLOUT_IN_PROGRESS, lws, 4, 4) is None
    assert scale_down_held(Reason.STABLE, lws, 2, 4) is None
    # maxReplicas lowered to 2 mid-rollout: the autoscaler's 2 (or 1) keeps 2, not 3
    assert scale_down_held(Reason.ROLLOUT_IN_PROGRESS, lws, 2, 2) is None
    assert scale_down_held(Reason.ROLLOUT_IN_PROGRESS, lws, 1, 2) == 2
