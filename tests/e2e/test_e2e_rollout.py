"""Engine changes without downtime on `kimik3 dev up`: surge rollouts under load (issue 12).

One cluster for this module, 4 GB300 racks of 2 trays (a TP8 group fills one; exclusive placement
gives each group a rack, so a surge group needs a free one), started with ``readiness_probes``:
a group leader turns Ready only once its simulated engine has loaded (``LOAD_S``), as on GPUs,
so the LeaderWorkerSet cannot count a loading group as available. Load runs throughout through
the deployment's front (the simulator's stand-in for the client Service, which forwards only to
loaded engines), and a ``Recorder`` samples the groups every 0.1 s.

With ``maxSurge: 1, maxUnavailable: 0`` (the default of spec.rollout) on one group: a new
LeaderWorkerSet ``k3-engine-<hash>`` loads the new revision beside ``k3-engine``, which is deleted
once the new group is Ready (``controller.fleet``). So the rollout takes one load time, and a Ready
group serves throughout.
"""

from __future__ import annotations

import concurrent.futures
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
import requests
from devenv import DevEnv, dev_cluster

from kimik3.controller.launchers import template_launchers
from kimik3.kube.labels import (DEPLOYMENT_LABEL, LWS_GROUP_INDEX_LABEL, LWS_NAME_LABEL, LWS_REVISION_LABEL,
                                LWS_WORKER_INDEX_LABEL)
from kimik3.render.configmap import PLAN_KEY, mounted
from kimik3_dev.devcluster.cluster import UpOptions
from kimik3_dev.devcluster.racks import RackShape
from kimik3_dev.devcluster.rollout import Load, Recorder, Rollout, measure_rollout, sample, serving
from kimik3_dev.sim.load import summarize
from support.waiting import wait_for

LOAD_S = 8.0
"""Simulated load time of every group, seconds (the CR's sim-load-time annotation)."""
WAIT_S = 180.0
"""Seconds any one wait of these tests may take: a group placed, loaded and answering takes ~10-60 s,
more beside another deployment's groups on a loaded machine (one run waited past 120 s)."""
NEW_IMAGE = "vllm/vllm-openai:v0.33.1"


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevEnv]:
    with dev_cluster(tmp_path_factory.mktemp("rollout"), UpOptions(
            shape=RackShape(profile="gb300", racks=4, trays_per_rack=2), readiness_probes=True,
            load_time=f"{LOAD_S:g}s", kueue=False, die_with_parent=True,
            wait_timeout_s=180.0)) as dev:
        yield dev


@pytest.fixture
def ns(env: DevEnv) -> Iterator[str]:
    """A fresh namespace, its deployment's pods gone afterwards (``DevEnv.fresh_namespace``)."""
    with env.fresh_namespace("ro", WAIT_S) as name:
        yield name


FIRST = "k3-engine"
"""The deployment's first LeaderWorkerSet; a rollout's new one is ``k3-engine-<template hash>``."""


def snapshot(env: DevEnv, ns: str) -> tuple[tuple[int, str, str, bool, str], ...]:
    """(group, leader uid, revision, every pod Ready, LeaderWorkerSet) of each live group."""
    return sample(env.rest, ns, "k3", 2)


def deployment(env: DevEnv, ns: str, replicas: int, **spec: Any) -> dict[str, Any]:
    cr = env.deployment(ns, replicas=replicas)
    cr["metadata"]["annotations"] = {"inference.kimik3.io/sim-load-time": f"{LOAD_S:g}s"}  # simulator only
    cr["spec"].update(spec)
    return cr


def serve(env: DevEnv, ns: str, groups: int) -> tuple[str, str | None]:
    return serving(env.rest, env.cluster.state_dir, ns, "k3", groups, 2, WAIT_S)


def rollout_under_load(env: DevEnv, ns: str, groups: int, **rollout: Any) -> Rollout:
    """``groups`` groups, then an image change under load."""
    cr = deployment(env, ns, groups, **({"rollout": rollout} if rollout else {}))
    return measure_rollout(env.rest, env.cluster.state_dir, cr, {"engine": {"image": NEW_IMAGE}},
                           timeout_s=WAIT_S + groups * 4 * LOAD_S)


def test_one_group_image_change_serves_throughout(env, ns):
    done = rollout_under_load(env, ns, 1)
    samples, old, took = done.samples, done.old_revision, done.seconds
    assert done.requests > 20 and done.failed == 0, summarize(done.results)["total"]
    assert all(any(g[3] for g in s) for s in samples), "a sample without a Ready group"
    for s in samples:  # the old group goes only once a group of the new revision is Ready
        if not any(g[2] == old and g[3] for g in s):
            assert any(g[2] != old and g[3] for g in s), s
    assert any(len(s) == 2 for s in samples), "no surge group was created"
    status = env.get_cr(ns)["status"]
    assert status["rollout"]["currentRevision"] == status["rollout"]["updateRevision"] != old
    reasons = [e.get("reason") for e in env.events(ns)]
    assert "RolloutStep" in reasons and "RolloutComplete" in reasons, reasons
    print(f"\none group: rollout took {took:.1f} s ({took / LOAD_S:.1f} load times of {LOAD_S:g} s), "
          f"{done.requests} requests, {done.failed} failed")


def test_three_groups_keep_three_ready(env, ns):
    done = rollout_under_load(env, ns, 3, maxSurge=1)
    assert done.failed == 0, summarize(done.results)["total"]
    assert done.fewest_ready >= 3, [s for s in done.samples if sum(1 for g in s if g[3]) < 3][:3]
    print(f"\nthree groups: rollout took {done.seconds:.1f} s ({done.seconds / LOAD_S:.1f} load times), "
          f"fewest Ready {done.fewest_ready}")


def test_labels_annotations_and_replicas_change_no_pod(env, ns):
    env.apply(deployment(env, ns, 1))
    serve(env, ns, 1)
    before = snapshot(env, ns)
    lws_path = f"/apis/leaderworkerset.x-k8s.io/v1/namespaces/{ns}/leaderworkersets/k3-engine"
    lws_generation = env.rest.get(lws_path)["metadata"]["generation"]
    env.rest.call("PATCH", env.cr_path(ns), content_type="application/merge-patch+json",
                  body={"metadata": {"labels": {"team": "inference"}, "annotations": {"note": "edited"}}})
    time.sleep(3.0)  # the operator reconciles the edit within a second (watch event)
    assert snapshot(env, ns) == before
    assert env.rest.get(lws_path)["metadata"]["generation"] == lws_generation
    env.scale(ns, 2)
    serve(env, ns, 2)
    after = {g[0]: g for g in snapshot(env, ns)}
    assert after[0] == before[0], "group 0 was restarted by a replica change"
    assert after[1][2] == before[0][2], "the new group runs another revision"


FINE_ITL = [round(0.001 * i, 3) for i in range(1, 41)] + [0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5, 5.0]
"""ITL buckets 1 ms wide up to 40 ms (vLLM's --custom-histogram-buckets): vLLM's defaults (10, 25,
50 ms, ...) cannot tell a DSpark step of ~10 ms from one of ~20 ms."""


def test_a_release_twice_as_slow_fails_its_canary_and_is_rolled_back(env, ns):
    prometheus = env.state["urls"]["prometheus"]
    cr = deployment(env, ns, 1, rollout={"canary": {"groups": 1, "bake": "5m", "analysis": {
        "interval": "15s", "failureLimit": 2, "maxLatency": "4.5ms"}}},
        autoscaling={"metricsSource": {"type": "prometheus", "prometheusUrl": prometheus}})
    cr["spec"]["engine"]["extraArgs"] = ["--custom-histogram-buckets", json.dumps({"inter_token_latency": FINE_ITL})]
    cr["spec"]["monitoring"] = {"interval": "5s"}  # the PodMonitor's: 3 scrapes a 15 s check window, not 1
    env.apply(cr)
    url, model = serve(env, ns, 1)
    ((_, uid, old, _, _),) = snapshot(env, ns)
    ((before, before_args),) = _launchers(env, ns).items()
    launchers_before = (before, before_args)
    with Load(url, model) as load, Recorder(lambda: snapshot(env, ns), period_s=0.2) as rec:
        env.rest.call("PATCH", env.cr_path(ns), content_type="application/merge-patch+json",
                      body={"spec": {"engine": {"env": [{"name": "KIMIK3_SIM_SLOWDOWN", "value": "2"}]}}})
        launchers_during = wait_for(lambda: set(_launchers(env, ns)) - {before} or None, WAIT_S,
                                    "the failed release's launcher ConfigMap")
        rolled_back = wait_for(lambda: _rolled_back(env, ns), WAIT_S + 60, "the canary analysis to roll back")
        wait_for(lambda: [g[:3] for g in snapshot(env, ns)] == [(0, uid, old)] or None, WAIT_S,
                 "the canary group to go")
    summary = summarize(load.results)["total"]
    assert summary["errors"] == 0, summary
    assert any(len(s) == 2 for s in rec.values), "no canary group ran"
    assert all(any(g[1] == uid and g[3] for g in s) for s in rec.values), "the old group stopped serving"
    message = rolled_back["rolledBack"]["message"]
    measured = float(message.split("timePerOutputToken ")[1].split(" ms")[0])
    assert measured > 4.5, message
    progressing = next(c for c in env.get_cr(ns)["status"]["conditions"] if c["type"] == "Progressing")
    assert (progressing["status"], progressing["reason"]) == ("False", "RolledBack")
    events = {e.get("reason"): e for e in env.events(ns)}
    assert events["RolledBack"]["type"] == "Warning" and "CanaryStarted" in events
    # the restored templates mount the launcher ConfigMap of before the change, still there with
    # its plan; the failed release's (its env differs, so its plan hash) is kept as the spec's own
    lws = env.rest.get(f"/apis/leaderworkerset.x-k8s.io/v1/namespaces/{ns}/leaderworkersets/k3-engine")
    (restored,) = template_launchers(lws["spec"]["leaderWorkerTemplate"])
    assert restored == launchers_before[0] and _mounted(env, ns, 0) == restored
    assert set(_launchers(env, ns)) == {restored, *launchers_during} and restored not in launchers_during
    assert _launchers(env, ns)[restored] == launchers_before[1]
    print(f"\nrolled back: {message}")


def _launchers(env: DevEnv, ns: str) -> dict[str, list[str]]:
    """Each launcher ConfigMap of deployment k3: name -> the leader rank's vLLM arguments."""
    items = env.rest.items(f"/api/v1/namespaces/{ns}/configmaps", f"{DEPLOYMENT_LABEL}=k3")
    return {c["metadata"]["name"]: json.loads(c["data"][PLAN_KEY])["ranks"][0]["args"] for c in items
            if c["metadata"]["name"].startswith("k3-launcher-")}


def _leader(env: DevEnv, ns: str, group: int, lws: str | None = None) -> dict[str, Any] | None:
    """The live leader pod of ``group`` of LeaderWorkerSet ``lws`` (of any of k3's when None)."""
    pods = env.rest.items(f"/api/v1/namespaces/{ns}/pods", f"{LWS_NAME_LABEL}={lws}" if lws else
                          f"{DEPLOYMENT_LABEL}=k3,{LWS_NAME_LABEL},{LWS_GROUP_INDEX_LABEL}={group},"
                          f"{LWS_WORKER_INDEX_LABEL}=0")
    pods = [p for p in pods if not p["metadata"].get("deletionTimestamp")
            and p["metadata"]["labels"].get(LWS_GROUP_INDEX_LABEL) == str(group)
            and p["metadata"]["labels"].get(LWS_WORKER_INDEX_LABEL) == "0"]
    return pods[0] if pods else None


def _mounted(env: DevEnv, ns: str, group: int) -> str | None:
    """The launcher ConfigMap the leader pod of ``group`` (of any LeaderWorkerSet) mounts."""
    pod = _leader(env, ns, group)
    return mounted(pod["spec"]) if pod else None


def _seqs(args: list[str]) -> str:
    return args[args.index("--max-num-seqs") + 1]


def test_an_old_group_restarted_mid_rollout_keeps_its_arguments(env, ns):
    """The launcher ConfigMap is per launch plan: the old group 0, recreated on the old revision
    while the new LeaderWorkerSet's group of a new --max-num-seqs loads, mounts the old plan's
    ConfigMap with the old arguments; once every group runs the new revision the old ConfigMap
    is deleted."""
    env.apply(deployment(env, ns, 1))
    serve(env, ns, 1)
    ((_, uid, old, _, _),) = snapshot(env, ns)
    ((old_cm, old_args),) = _launchers(env, ns).items()
    assert _mounted(env, ns, 0) == old_cm and _seqs(old_args) == "64"
    env.rest.call("PATCH", env.cr_path(ns), body={"spec": {"engine": {"maxNumSeqs": 32}}},
                  content_type="application/merge-patch+json")
    surge = wait_for(lambda: next((g for g in snapshot(env, ns) if g[4] != FIRST and g[2] and g[2] != old), None),
                     WAIT_S, "the surge group of the new revision")
    assert not surge[3], "the surge group was Ready before group 0 could be restarted: raise LOAD_S"
    env.rest.delete(f"/api/v1/namespaces/{ns}/pods/{_leader(env, ns, 0, FIRST)['metadata']['name']}")
    again = wait_for(lambda: (lambda p: p if p and p["metadata"]["uid"] != uid else None)(_leader(env, ns, 0, FIRST)),
                     WAIT_S, "the old group 0 recreated")
    assert again["metadata"]["labels"][LWS_REVISION_LABEL] == old, "group 0 came back on the new revision"
    assert mounted(again["spec"]) == old_cm
    launchers = _launchers(env, ns)
    (new_cm,) = set(launchers) - {old_cm}
    assert (_seqs(launchers[old_cm]), _seqs(launchers[new_cm])) == ("64", "32")
    wait_for(lambda: len(snapshot(env, ns)) == 1 and all(g[2] != old and g[3] for g in snapshot(env, ns))
             and _progressing(env, ns).get("status") == "False", WAIT_S + 4 * LOAD_S, "the rollout to finish")
    wait_for(lambda: set(_launchers(env, ns)) == {new_cm}, 15.0, f"ConfigMap {old_cm} to be deleted")
    assert _mounted(env, ns, 0) == new_cm
    deleted = [e for e in env.events(ns) if e.get("reason") == "Deleted" and old_cm in e.get("message", "")]
    assert deleted and "no group runs a revision that mounts it" in deleted[0]["message"], deleted


def _rolled_back(env: DevEnv, ns: str) -> dict[str, Any] | None:
    rollout = ((env.get_cr(ns) or {}).get("status") or {}).get("rollout") or {}
    return rollout if rollout.get("rolledBack") else None


def _progressing(env: DevEnv, ns: str) -> dict[str, Any]:
    return env.condition(ns, "Progressing") or {}


def _image(env: DevEnv, ns: str, image: str) -> None:
    env.rest.call("PATCH", env.cr_path(ns), body={"spec": {"engine": {"image": image}}},
                  content_type="application/merge-patch+json")


def test_edits_and_a_revert_during_a_rollout_keep_every_group_serving(env, ns):
    """F17: three groups, maxUnavailable 0; A -> B, while the B surge group loads B -> C (B's
    LeaderWorkerSet, with no Ready group, goes; C's is created), then back to A (C's goes). At
    least 3 groups Ready at every sample; the three serving groups are never restarted."""
    env.apply(deployment(env, ns, 3))
    serve(env, ns, 3)
    start = snapshot(env, ns)
    (original,) = {g[2] for g in start}
    with Recorder(lambda: snapshot(env, ns), period_s=0.1) as rec:
        _image(env, ns, "vllm/vllm-openai:v0.33.1")  # B
        b = wait_for(lambda: next((g for g in snapshot(env, ns) if g[4] != FIRST and not g[3] and g[2]), None),
                     WAIT_S, "the surge group of B")
        _image(env, ns, "vllm/vllm-openai:v0.33.2")  # C, while B loads
        wait_for(lambda: any(g[4] != FIRST and g[2] not in (b[2], original) for g in snapshot(env, ns)), WAIT_S,
                 "the surge group of C")
        _image(env, ns, "vllm/vllm-openai:v0.33.0")  # back to A
        wait_for(lambda: snapshot(env, ns) == start and _progressing(env, ns).get("status") == "False", WAIT_S,
                 "the surge group to go and Progressing=False")
    fewest = min(sum(1 for g in s if g[3]) for s in rec.values)
    assert fewest >= 3, [s for s in rec.values if sum(1 for g in s if g[3]) < 3][:3]
    assert all({g[1] for g in s if g[4] == FIRST} == {g[1] for g in start} for s in rec.values), \
        "a serving group was restarted by an edit"
    assert env.get_cr(ns)["status"]["rollout"]["updateRevision"] == original


def test_no_room_for_a_surge_group_blocks_and_takes_nothing_down(env, ns):
    """Another deployment holds the other 3 racks: the surge group has none (exclusive placement).
    SurgeBlocked, group 0 untouched; once a rack frees the rollout goes on by itself."""
    with env.namespace(f"{ns}-other", WAIT_S) as other:
        env.apply(deployment(env, ns, 1))
        env.apply(deployment(env, other, 3))
        serve(env, ns, 1)
        serve(env, other, 3)
        ((_, uid, old, _, _),) = snapshot(env, ns)
        with Recorder(lambda: snapshot(env, ns), period_s=0.2) as rec:
            _image(env, ns, NEW_IMAGE)
            blocked = wait_for(lambda: _progressing(env, ns).get("reason") == "SurgeBlocked" and _progressing(env, ns),
                               WAIT_S, "Progressing=True SurgeBlocked")
            time.sleep(3.0)
            assert [g[:3] for g in snapshot(env, ns) if g[4] == FIRST] == [(0, uid, old)]
            env.scale(other, 2)
            wait_for(lambda: _progressing(env, ns).get("status") == "False"
                     and all(g[2] != old and g[3] for g in snapshot(env, ns)) and len(snapshot(env, ns)) == 1,
                     WAIT_S + 4 * LOAD_S, "the rollout to finish once a rack is free")
        assert blocked["status"] == "True" and "group 0 of k3-engine-" in blocked["message"] \
            and "cannot be placed" in blocked["message"], blocked
        assert "no old group is taken down" in blocked["message"]
        assert all(any(g[3] for g in s) for s in rec.values), "a sample without a Ready group"


PARITY_CANARY = {"groups": 1, "bake": "30s", "analysis": {"interval": "10s", "minChecks": 2, "maxLatency": "50ms"}}
"""A canary judged on its outputs: the latency limit is far above what any release here shows, so
only output parity can roll a release back."""


POD_SCRAPE = {"metricsSource": {"type": "podScrape"}}
"""The canary analysis reads the canary's leaders at their pod IPs (where parity asks them too)."""


def _env_release(env: DevEnv, ns: str, image: str, **sim: str) -> None:
    """Roll out ``image`` with the simulator's bad-release env ``sim`` (KIMIK3_SIM_* -> value)."""
    env.rest.call("PATCH", env.cr_path(ns), content_type="application/merge-patch+json", body={"spec": {"engine": {
        "image": image, "env": [{"name": k, "value": v} for k, v in sim.items()]}}})


def _events(env: DevEnv, ns: str, reason: str) -> list[str]:
    """The messages of the Events of ``reason`` in ``ns``."""
    return [e.get("message", "") for e in env.events(ns) if e.get("reason") == reason]


def _canary(env: DevEnv, ns: str) -> dict[str, Any]:
    return (((env.get_cr(ns) or {}).get("status") or {}).get("rollout") or {}).get("canary") or {}


def test_a_corrupting_release_is_rolled_back_by_output_parity_and_a_healthy_one_promoted(env, ns):
    """Issue 25: a release corrupting 60% of its prompts' greedy outputs, its latency unchanged, is
    rolled back at its first check, the CR quoting the prompt and the first diverging token; no
    old group restarts and the load sees no error. Then a healthy release, its groups under the
    simulator's benign divergence (2% of the prompts per group), passes parity and is promoted."""
    cr = deployment(env, ns, 1, rollout={"canary": PARITY_CANARY}, autoscaling=POD_SCRAPE)
    env.apply(cr)
    url, model = serve(env, ns, 1)
    ((_, uid, old, _, _),) = snapshot(env, ns)
    with Load(url, model) as load, Recorder(lambda: snapshot(env, ns), period_s=0.2) as rec, \
            Recorder(lambda: _canary(env, ns) or None, period_s=0.1) as canaries:
        _env_release(env, ns, NEW_IMAGE, KIMIK3_SIM_CORRUPT_RATE="0.6")
        rolled_back = wait_for(lambda: _rolled_back(env, ns), WAIT_S, "output parity to roll the release back")
        wait_for(lambda: [g[:3] for g in snapshot(env, ns)] == [(0, uid, old)] or None, WAIT_S,
                 "the canary group to go")
        message = rolled_back["rolledBack"]["message"]
        progressing = _progressing(env, ns)
        _env_release(env, ns, "vllm/vllm-openai:v0.33.2")  # a healthy release: benign divergence only
        wait_for(lambda: _events(env, ns, "CanaryPromoted"), WAIT_S + 60, "the healthy canary to be promoted")
        wait_for(lambda: _progressing(env, ns).get("status") == "False" and len(snapshot(env, ns)) == 1
                 and all(g[2] != old and g[3] for g in snapshot(env, ns)), WAIT_S + 4 * LOAD_S, "the rollout to finish")
    summary = summarize(load.results)["total"]
    assert summary["errors"] == 0, summary
    corrupt_samples = [s for s in rec.values if any(g[4] != FIRST for g in s)]
    assert corrupt_samples, "no canary group ran"
    # the rollback: by parity, quoting the prompt and its first diverging token
    assert (progressing["status"], progressing["reason"]) == ("False", "RolledBack"), progressing
    assert " by output parity: " in message and " of 16 golden prompt(s) differ (" in message, message
    differing = int(message.split("output parity: ")[1].split(" of 16")[0])
    assert differing > 4, message  # over maxMismatchRate 25%
    assert "; first: prompt \"" in message and "\" diverges at output token " in message and \
        ": canary \"" in message and ", old group \"" in message, message
    assert f"and old group {FIRST}-0 over 32 token(s)" in message
    # no old group restarted while the corrupting release baked
    before_healthy = [s for s in rec.values if not any(g[2] not in (old, None) and g[4] != FIRST and g[3] for g in s)]
    assert all(any(g[1] == uid for g in s) for s in before_healthy[:len(corrupt_samples)]), "the old group restarted"
    # the healthy release: parity passed under benign divergence, then promoted
    parity = canaries.values[-1]["parity"]  # the healthy canary's last status before the rollout settled
    assert parity["result"] == "Passed" and parity["passedRounds"] >= 1 and parity["maxMismatchRate"] == 0.25, parity
    assert parity["mismatchRate"] <= 0.25 and parity["prompts"] == 16, parity
    (promoted,) = _events(env, ns, "CanaryPromoted")
    assert " between canary group(s) " in promoted and "limit parity.maxMismatchRate 25.0%)" in promoted, promoted
    assert _events(env, ns, "RolledBack")
    print(f"\nrolled back: {message}\npromoted: {promoted}")


def test_a_canary_without_any_traffic_gets_its_checks_from_probe_requests(env, ns):
    """No load at all, parity off (its 16 prompts a check would fill the windows themselves): the
    first window read has no traffic; from then on the analysis's own bounded probe requests give
    every check something to judge, and the canary is promoted on minChecks passing checks."""
    cr = deployment(env, ns, 1, rollout={"canary": {**PARITY_CANARY, "parity": {"enabled": False}}},
                    autoscaling=POD_SCRAPE)
    env.apply(cr)
    serve(env, ns, 1)
    with Recorder(lambda: _canary(env, ns) or None, period_s=0.1) as canaries:
        _image(env, ns, NEW_IMAGE)
        wait_for(lambda: _events(env, ns, "CanaryPromoted"), WAIT_S + 60, "the canary to be promoted on probe requests")
    last = canaries.values[-1]  # the canary's last status before the rollout settled
    results = [h["result"] for h in last["history"]]
    first = results.index("NoTraffic")  # after the pod scrape's first reading (NoReading: WarmingUp)
    passed = results.index("Passed")  # a loaded machine may scrape a check's probes only after the next check
    assert set(results[:first]) <= {"NoReading"} and set(results[first:passed]) == {"NoTraffic"}, results
    assert set(results[passed:]) == {"Passed"} and passed - first <= 2, results
    assert last["probing"] and last["probeRequests"] == 8 * (len(results) - first), last
    assert all(h["requests"] == 8 for h in last["history"][passed:]), last["history"]  # each window: the 8 probes
    assert last["parity"]["result"] == "Skipped" and "parity.enabled is false" in last["parity"]["message"]
    (promoted,) = _events(env, ns, "CanaryPromoted")
    assert ": 2 check(s), 0 failed;" in promoted, promoted  # minChecks, both windows filled by probes
    print(f"\nno traffic: checks {results}, {last['probeRequests']} probe requests; {promoted}")


# ---------------------------------------------------------------- drained exits -------------

DRAIN_PERIOD_S = 1
"""probes.periodSeconds of the drain test: the leader's preStop fails readiness for 1 s x 3 + 5 s."""
DEREGISTER_S = DRAIN_PERIOD_S * 3 + 5
LONG_TOKENS = 4000
SLOWDOWN = 3
"""KIMIK3_SIM_SLOWDOWN of the drain test: every step 3x as long, so a 4,000-token generation is
still running when SIGTERM comes, DEREGISTER_S after the deletion (the test checks it was)."""


def test_a_scale_down_from_three_groups_to_one_lets_every_request_finish(env, ns):
    """Drained exits (issue 25 item 5) under `kimik3 dev load`'s users through the Service: a
    4,000-token generation on group 2 (a group the scale-down takes: a StatefulSet goes from the
    top) completes whole although its leader pod is deleted mid-generation, after the preStop
    (readiness failing for DEREGISTER_S) and SIGTERM (vLLM's --shutdown-timeout then lets it
    finish); no request of the load fails."""
    cr = deployment(env, ns, 3)
    cr["spec"]["probes"] = {**cr["spec"].get("probes", {}), "periodSeconds": DRAIN_PERIOD_S, "drainTimeout": "90s"}
    cr["spec"]["engine"]["env"] = [*cr["spec"]["engine"].get("env", []),
                                   {"name": "KIMIK3_SIM_SLOWDOWN", "value": str(SLOWDOWN)}]
    env.apply(cr)
    url, model = serve(env, ns, 3)
    leader2 = env.groups(ns)[2][0]  # by worker index: the leader first
    engine2 = f"http://{leader2['status']['podIP']}:8000"

    def long_generation() -> tuple[int, dict[str, Any], float]:
        r = requests.post(f"{engine2}/v1/completions", timeout=300,
                          json={"model": model, "prompt": "tell a long story", "max_tokens": LONG_TOKENS})
        return r.status_code, r.json(), time.monotonic()

    with Load(url, model, users=4) as load, concurrent.futures.ThreadPoolExecutor(1) as pool:
        time.sleep(2.0)
        generation = pool.submit(long_generation)
        time.sleep(1.0)
        scaled = time.monotonic()
        env.scale(ns, 1)
        wait_for(lambda: sorted(env.groups(ns)) == [0], WAIT_S, "groups 1 and 2 deleted")
        status, body, ended = generation.result(timeout=180)
        time.sleep(3.0)
    assert status == 200, body
    assert body["usage"]["completion_tokens"] == LONG_TOKENS and body["choices"][0]["finish_reason"] == "length"
    assert ended - scaled > DEREGISTER_S, "the generation ended before SIGTERM: it proves no drain"
    total = summarize(load.results)["total"]
    assert total["requests"] > 20 and total["errors"] == 0, total
    print(f"\ndrained exits: the {LONG_TOKENS}-token generation ended {ended - scaled:.1f} s after the scale-down "
          f"(SIGTERM at ~{DEREGISTER_S} s); {total['requests']} requests over the scale-down 3 -> 1, "
          f"{total['errors']} failed")
