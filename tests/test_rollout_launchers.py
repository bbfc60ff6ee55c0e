"""Launcher ConfigMaps per launch plan (``render.configmap``, ``controller.launchers``): each
revision's templates mount their own, every one a revision with groups still needs is kept, and
the others go only once the rollout settled (one LeaderWorkerSet left). The LeaderWorkerSets and
pods are written as LWS v0.9.0 makes them (``test_rollout_status``); tests/e2e/test_e2e_rollout.py checks the same on
`dev up` with the real LeaderWorkerSet manager."""

from __future__ import annotations

import copy
import json

from kimik3.admission import admit
from kimik3.kube.groups import groups_of
from kimik3.controller.fleet import engine_sets
from kimik3.controller.launchers import in_use, settled, stale, template_launchers
from kimik3.render.configmap import PLAN_KEY, plan_hash
from kimik3.render.leaderworkerset import PLAN_HASH_ANNOTATION
from kimik3.render.meta import Owner
from support.rendering import by_kind, render_cr
from test_rollout_status import FIRST, NEW, OLD, SECOND, cr, group

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


def engine_set(name_: str, lws_obj: dict, minute: int = 0, deleting: bool = False):
    """The EngineSet of LeaderWorkerSet ``name_`` with ``lws_obj``'s templates."""
    meta = {"name": name_, "uid": name_, "creationTimestamp": f"2026-12-01T00:{minute:02d}:00Z"}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-01T01:00:00Z"
    (built,) = engine_sets([{"metadata": meta, "spec": copy.deepcopy(lws_obj["spec"])}], groups_of([], 2))
    return built


def test_a_one_group_rollout_keeps_the_old_configmap_until_it_settled():
    (cm_a, lws_a), (cm_b, lws_b) = rendered(256), rendered(128)
    listed = [cm_a, cm_b, {"metadata": {"name": "k3-latency-engine-config"}}]  # not a launcher
    a, b = engine_set(FIRST, lws_a), engine_set(SECOND, lws_b, 5)
    steps = [  # the deployment's LeaderWorkerSets, the pods, settled
        ([a], mounting(group(0, OLD, True), lws_a), False),  # the spec renders B: not yet applied
        ([a, b], mounting(group(0, OLD, True), lws_a) + mounting(group(0, NEW, False, SECOND), lws_b), False),
        ([engine_set(FIRST, lws_a, deleting=True), b],  # A retired, its pods still terminating
         mounting(group(0, NEW, True, SECOND), lws_b), False),
        ([b], mounting(group(0, NEW, True, SECOND), lws_b), True),
    ]
    for i, (sets, pods, done) in enumerate(steps):
        assert settled(sets) == (len(sets) == 1), i
        keep = in_use(name(cm_b), sets, pods)
        assert stale(OWNER, listed, keep) == ([name(cm_a)] if done else []), i


def test_a_pause_or_a_rollback_keeps_the_configmap_of_the_templates_it_holds():
    (cm_a, lws_a), (cm_b, _) = rendered(256), rendered(128)
    held = [engine_set(FIRST, lws_a)]  # the spec renders B, but A's templates stay
    assert settled(held) and in_use(name(cm_b), held, []) == {name(cm_a), name(cm_b)}


def test_after_the_upgrade_rollout_the_shared_configmap_of_old_goes_and_nothing_of_others():
    (cm_b, lws_b) = rendered(128)
    legacy = {"metadata": {"name": "k3-latency-launcher"}}  # the one ConfigMap of every revision before
    others = [{"metadata": {"name": "k3-latency-engine"}}, {"metadata": {"name": "k3-latency-launcherx"}}]
    done = [engine_set(SECOND, lws_b)]
    pods = mounting(group(0, NEW, True, SECOND), lws_b)
    assert settled(done)
    assert stale(OWNER, [legacy, cm_b, *others], in_use(name(cm_b), done, pods)) == ["k3-latency-launcher"]
