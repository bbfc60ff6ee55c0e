"""Launcher ConfigMaps per launch plan (``render.configmap``, ``controller.launchers``): each
revision's templates mount their own, every one a revision with groups still needs is kept, and
the others go only once the rollout settled. The LeaderWorkerSet and pods are written as LWS
v0.9.0 makes them (``test_rollout_status``); tests/e2e/test_e2e_rollout.py checks the same on
`dev up` with the real LeaderWorkerSet manager."""

from __future__ import annotations

import copy
import json

from kimik3.admission import admit
from kimik3.api.v1alpha1 import CanaryStatus
from kimik3.controller.launchers import in_use, settled, stale, template_launchers
from kimik3.controller.rollout import groups, rollout_status
from kimik3.render.configmap import PLAN_KEY, plan_hash
from kimik3.render.leaderworkerset import PLAN_HASH_ANNOTATION
from kimik3.render.meta import Owner
from support.rendering import by_kind, render_cr
from test_rollout_status import NEW, OLD, cr, group, lws

OWNER = Owner("k3-latency", "inference", "u1")


def rendered(max_num_seqs: int) -> tuple[dict, dict]:
    """(launcher ConfigMap, LeaderWorkerSet) of the latency recipe at engine.maxNumSeqs."""
    objects = render_cr(cr(replicas=1, engine={"maxNumSeqs": max_num_seqs})).objects
    return by_kind(objects, "ConfigMap"), by_kind(objects, "LeaderWorkerSet")


def mounting(pods: list[dict], lws_obj: dict) -> list[dict]:
    """``pods`` with the pod spec of ``lws_obj``'s templates (their launcher volume)."""
    spec = lws_obj["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]
    return [{**p, "spec": copy.deepcopy(spec)} for p in pods]


def name(cm: dict) -> str:
    return cm["metadata"]["name"]


def args(cm: dict) -> list[str]:
    return json.loads(cm["data"][PLAN_KEY])["ranks"][0]["args"]


def test_each_launch_plan_has_its_configmap_named_by_the_plan_hash_its_templates_carry():
    (cm_a, lws_a), (cm_b, lws_b) = rendered(256), rendered(128)
    template = lws_a["spec"]["leaderWorkerTemplate"]
    digest = template["leaderTemplate"]["metadata"]["annotations"][PLAN_HASH_ANNOTATION]
    assert name(cm_a) == f"k3-latency-launcher-{digest}"
    assert digest == plan_hash(admit(cr(replicas=1, engine={"maxNumSeqs": 256})["spec"]))
    assert template_launchers(template) == {name(cm_a)}
    assert template_launchers(lws_b["spec"]["leaderWorkerTemplate"]) == {name(cm_b)} != {name(cm_a)}
    assert args(cm_a)[args(cm_a).index("--max-num-seqs") + 1] == "256"
    assert args(cm_b)[args(cm_b).index("--max-num-seqs") + 1] == "128"
    # an image change keeps the plan: both revisions would mount one ConfigMap with the same plan
    image = render_cr(cr(replicas=1, engine={"maxNumSeqs": 256, "image": "vllm/vllm-openai:v0.33.1"})).objects
    assert name(by_kind(image, "ConfigMap")) == name(cm_a)


def test_a_one_group_rollout_keeps_the_old_configmap_until_it_settled():
    (cm_a, lws_a), (cm_b, lws_b) = rendered(256), rendered(128)
    listed = [cm_a, cm_b, {"metadata": {"name": "k3-latency-engine-config"}}]  # not a launcher
    steps = [  # (LWS status: replicas, groups, ready, updated; generation, observed; updating), pods, settled
        (lws(1, 1, 1, 1, generation=8, observed=7), mounting(group(0, OLD, True), lws_a), False),
        (lws(1, 2, 1, 1, generation=8, observed=8, updating=True),
         mounting(group(0, OLD, True), lws_a) + mounting(group(1, NEW, False), lws_b), False),
        (lws(1, 2, 2, 1, generation=8, observed=8, updating=True),
         mounting(group(0, OLD, False), lws_a) + mounting(group(1, NEW, True), lws_b), False),
        (lws(1, 2, 1, 2, generation=8, observed=8),  # every group on B: no group of A can come back
         mounting(group(0, NEW, False), lws_b) + mounting(group(1, NEW, True), lws_b), True),
        (lws(1, 1, 1, 1, generation=8, observed=8), mounting(group(0, NEW, True), lws_b), True),
    ]
    for i, (lws_obj, pods, done) in enumerate(steps):
        status = rollout_status(lws_obj, groups(pods, 2))
        live = {**lws_obj, "spec": {**lws_obj["spec"], **lws_b["spec"], "replicas": 1}}
        assert settled(live, status) == done, i
        keep = in_use(name(cm_b), live, pods, None)
        assert stale(OWNER, listed, keep) == ([name(cm_a)] if done else []), i


def test_unsettled_while_a_group_of_the_old_revision_has_no_pod_for_a_moment():
    """LWS recreates a whole group when one pod fails: for a moment no pod shows its ConfigMap."""
    (_, lws_a), (_, lws_b) = rendered(256), rendered(128)
    pods = mounting(group(1, NEW, False), lws_b)  # group 0 (revision A) is being recreated
    status = rollout_status(lws(1, 1, 0, 1, generation=8, observed=8, updating=True), groups(pods, 2))
    assert not settled(lws(1, 1, 0, 1, generation=8, observed=8, updating=True), status)


def test_a_pause_a_canary_and_a_rollback_keep_the_configmap_of_the_templates_they_hold():
    (cm_a, lws_a), (cm_b, lws_b) = rendered(256), rendered(128)
    held = {**lws(1, 1, 1, 1), "spec": {**lws_a["spec"]}}  # paused (or rolled back): A's templates stay
    pods = mounting(group(0, OLD, True), lws_a)
    assert settled(held, rollout_status(held, groups(pods, 2)))
    assert in_use(name(cm_b), held, [], None) == {name(cm_a), name(cm_b)}
    assert stale(OWNER, [cm_a, cm_b], in_use(name(cm_b), held, pods, None)) == []
    # a canary bakes B beside A: A's templates are kept in the canary status for a rollback
    baking = CanaryStatus(template_hash="b", previous_template=json.dumps(lws_a["spec"]["leaderWorkerTemplate"]))
    canary_lws = {**lws(1, 1, 1, 1), "spec": {**lws_b["spec"]}}
    assert in_use(name(cm_b), canary_lws, [], baking) == {name(cm_a), name(cm_b)}
    assert in_use(name(cm_b), canary_lws, [], baking.model_copy(update={"promoted": True})) == {name(cm_b)}


def test_after_the_upgrade_rollout_the_shared_configmap_of_old_goes_and_nothing_of_others():
    (cm_b, lws_b) = rendered(128)
    legacy = {"metadata": {"name": "k3-latency-launcher"}}  # the one ConfigMap of every revision before
    others = [{"metadata": {"name": "k3-latency-engine"}}, {"metadata": {"name": "k3-latency-launcherx"}}]
    done = {**lws(1, 1, 1, 1), "spec": {**lws_b["spec"]}}
    pods = mounting(group(0, NEW, True), lws_b)
    assert settled(done, rollout_status(done, groups(pods, 2)))
    assert stale(OWNER, [legacy, cm_b, *others], in_use(name(cm_b), done, pods, None)) == ["k3-latency-launcher"]
    # no group at all (replicas 0): nothing can start from an old plan
    empty = lws(0, 0, 0, 0)
    assert settled(empty, rollout_status(empty, []))
