"""The progress deadline of a rollout (``controller.rollout.Rollouts``, issue 25 item 3): new
groups that are not Ready ``rollout.progressDeadline`` after the rollout last progressed are
rolled back, canary or not, quoting what they wait on; a group turning Ready restarts the clock.
Step by step on one reconcile's inputs, as tests/test_rollout_canary.py does."""

from __future__ import annotations

from kimik3.admission import PROGRESS_MARGIN_S, admit
from kimik3.api.conditions import Reason
from kimik3.controller.rollout import Rollouts
from support.recipes import recipe
from support.rendering import by_kind, render_cr
from test_rollout_canary import CANARY, Clock, Figures, applied, live, remember, template_hash
from test_rollout_status import FIRST, NEW, OLD, group

PROBES = {"loadTimeout": "10m"}


def release(image: str, replicas: int = 1, **rollout):
    cr = recipe(uid="u1", replicas=replicas, rollout=rollout, engine={"image": image}, probes=PROBES)
    cr["metadata"]["generation"] = 2
    return cr, admit(cr["spec"]), by_kind(render_cr(cr).objects, "LeaderWorkerSet")


def pulling(pods: list[dict]) -> list[dict]:
    """``pods`` with their engine container waiting on an image that does not pull."""
    for p in pods:
        p["status"]["containerStatuses"] = [{"name": "engine", "ready": False, "restartCount": 0, "state": {
            "waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image vllm/vllm-openai:v0.33.9"}}}]
    return pods


def test_the_default_deadline_is_the_load_budget_and_a_margin():
    _, admitted, _ = release("vllm/vllm-openai:v0.33.1")
    assert admitted.seconds.progress_deadline == 600 + PROGRESS_MARGIN_S == 1200
    _, admitted, _ = release("vllm/vllm-openai:v0.33.1", progressDeadline="15m")
    assert admitted.seconds.progress_deadline == 900


def test_a_release_that_never_pulls_is_rolled_back_at_its_deadline_without_a_canary():
    _, _, old_lws = release("vllm/vllm-openai:v0.33.0")
    cr, admitted, new_lws = release("vllm/vllm-openai:v0.33.9", progressDeadline="15m")
    new = f"{FIRST}-{template_hash(new_lws)[:8]}"
    clock = Clock()
    rollouts = Rollouts(Figures([]), clock)
    cluster = live((FIRST, old_lws, 1), (new, new_lws, 1),
                   pods=group(0, OLD, True) + pulling(group(0, NEW, False, new)))
    step = rollouts.step(cr, admitted, new_lws, *cluster)
    assert step.verdict is None and step.rolled_back is None and step.requeue_after == 900
    assert (step.progress.groups, step.progress.ready_groups) == (1, 0)
    remember(cr, step)
    clock.now += 899
    step = rollouts.step(cr, admitted, new_lws, *cluster)
    assert step.rolled_back is None and step.requeue_after == 1
    clock.now += 1
    step = rollouts.step(cr, admitted, new_lws, *cluster)
    assert (step.verdict.status, step.verdict.reason) == ("False", Reason.PROGRESS_DEADLINE_EXCEEDED)
    assert step.verdict.message == (
        f"revision {NEW} rolled back to {OLD} at its progress deadline: 1 of 1 group(s) of {new} not Ready 900 s "
        "after the rollout last progressed (rollout.progressDeadline 15m): group 0: leader pod "
        f"{new}-0 is ImagePullBackOff; its workers wait for the leader address up to 30m (probes.leaderAddressTimeout), "
        "and the leader has 10m to load (probes.loadTimeout) (2 pods not ready); its groups go as the restored revision's are Ready, no old group restarts; "
        "edit the spec to roll out again")
    assert applied(step) == [(FIRST, 1, template_hash(old_lws))] and step.fleet.delete == [new]
    assert [e[:2] for e in step.events] == [("Warning", "ProgressDeadlineExceeded")]
    assert (step.rolled_back.reason, step.rolled_back.revision) == ("ProgressDeadlineExceeded", NEW)
    remember(cr, step)
    step = rollouts.step(cr, admitted, new_lws, *live((FIRST, old_lws, 1), pods=group(0, OLD, True)))
    assert step.verdict.reason == Reason.PROGRESS_DEADLINE_EXCEEDED and applied(step) == [
        (FIRST, 1, template_hash(old_lws))]


def test_each_group_turning_ready_restarts_the_clock():
    """Three groups with maxSurge 1 load one after the other: each gets the whole deadline."""
    _, _, old_lws = release("vllm/vllm-openai:v0.33.0", 3)
    cr, admitted, new_lws = release("vllm/vllm-openai:v0.33.1", 3, progressDeadline="15m")
    new = f"{FIRST}-{template_hash(new_lws)[:8]}"
    clock = Clock()
    rollouts = Rollouts(Figures([]), clock)
    olds = group(0, OLD, True) + group(1, OLD, True) + group(2, OLD, True)
    step = rollouts.step(cr, admitted, new_lws, *live((FIRST, old_lws, 3), (new, new_lws, 1),
                                                      pods=olds + group(0, NEW, False, new)))
    remember(cr, step)
    clock.now += 800  # group 0 Ready after 800 s; the set grows to 2 and group 1 loads
    step = rollouts.step(cr, admitted, new_lws, *live((FIRST, old_lws, 2), (new, new_lws, 2),
                                                      pods=olds[:4] + group(0, NEW, True, new) + group(1, NEW, False, new)))
    assert step.rolled_back is None and step.progress.ready_groups == 1 and step.requeue_after == 900
    remember(cr, step)
    clock.now += 800  # 1600 s into the rollout, 800 s into group 1's load: no rollback
    step = rollouts.step(cr, admitted, new_lws, *live((FIRST, old_lws, 2), (new, new_lws, 2),
                                                      pods=olds[:4] + group(0, NEW, True, new) + group(1, NEW, False, new)))
    assert step.rolled_back is None and step.requeue_after == 100


def test_a_canary_that_never_turns_ready_is_rolled_back_at_its_deadline():
    _, _, old_lws = release("vllm/vllm-openai:v0.33.0")
    cr, admitted, new_lws = release("vllm/vllm-openai:v0.33.9", canary=CANARY)
    canary = f"{FIRST}-{template_hash(new_lws)[:8]}"
    clock = Clock()
    rollouts = Rollouts(Figures([]), clock)
    crashed = group(0, NEW, False, canary)
    crashed[0]["status"]["containerStatuses"] = [{"name": "engine", "restartCount": 0, "state": {
        "terminated": {"exitCode": 1, "reason": "Error"}}}]
    cluster = live((FIRST, old_lws, 1), (canary, new_lws, 1), pods=group(0, OLD, True) + crashed)
    step = rollouts.step(cr, admitted, new_lws, *cluster)
    assert step.verdict.reason == Reason.CANARY_ANALYSIS and step.requeue_after == 10
    remember(cr, step)
    clock.now += 1200  # the default: loadTimeout 10m + 10m
    step = rollouts.step(cr, admitted, new_lws, *cluster)
    assert step.verdict.reason == Reason.PROGRESS_DEADLINE_EXCEEDED
    assert "(rollout.progressDeadline: probes.loadTimeout + 10m): group 0: leader pod " in step.verdict.message
    assert "is Running: container engine exited 1 (Error)" in step.verdict.message
    assert step.fleet.delete == [canary] and step.canary is None
