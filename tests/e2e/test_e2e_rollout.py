"""Engine changes without downtime on `kimik3 dev up`: surge rollouts under load (issue 12).

One cluster for this module, 4 GB300 racks of 2 trays (a TP8 group fills one; exclusive placement
gives each group a rack, so a surge group needs a free one), started with ``readiness_probes``:
a group leader turns Ready only once its simulated engine has loaded (``LOAD_S``), as on GPUs,
so the LeaderWorkerSet cannot count a loading group as available. Load runs throughout through
the deployment's front (the simulator's stand-in for the client Service, which forwards only to
loaded engines), and a ``Recorder`` samples the groups every 0.1 s.

LeaderWorkerSet v0.9.0 with ``maxSurge: 1, maxUnavailable: 0`` (the default of spec.rollout) on
one group: the surge group 1 loads the new revision, then group 0 is recreated on it, then the
surge group goes. So the rollout takes two load times (not one: LWS scales down from the top
index, so the surge group cannot stay in place of group 0), and a Ready group serves throughout.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import requests
from devenv import DevEnv, Recorder, dev_cluster

from kimik3.kube import pods as kpods
from kimik3.kube.labels import LWS_REVISION_LABEL
from kimik3_dev.devcluster.cluster import UpOptions
from kimik3_dev.devcluster.racks import RackShape
from kimik3_dev.devcluster.workloads import ensure_namespace
from kimik3_dev.sim.load import Phase, resolve_url, run_load, summarize
from support.waiting import wait_for

LOAD_S = 8.0
"""Simulated load time of every group, seconds (the CR's sim-load-time annotation)."""
WAIT_S = 120.0
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
    name = f"ro-{uuid.uuid4().hex[:8]}"
    ensure_namespace(env.rest, name)
    yield name
    env.rest.delete(env.cr_path(name))
    wait_for(lambda: not env.rest.items(f"/api/v1/namespaces/{name}/pods"), WAIT_S,
             f"the pods of namespace {name} to be gone")
    env.rest.delete(f"/api/v1/namespaces/{name}")


def snapshot(env: DevEnv, ns: str) -> tuple[tuple[int, str, str, bool], ...]:
    """(group, leader uid, revision, every pod Ready) of each live group."""
    out = []
    for index, pods in env.groups(ns).items():
        leader = next((p for p in pods if kpods.is_leader(p)), None)
        if leader is None:
            continue
        out.append((index, leader["metadata"]["uid"], kpods.labels(leader).get(LWS_REVISION_LABEL, ""),
                    len(pods) == 2 and all(map(kpods.is_ready, pods))))
    return tuple(out)


def serving(env: DevEnv, ns: str, groups: int) -> tuple[str, str | None]:
    def answering() -> tuple[str, str | None] | None:
        if sum(1 for g in snapshot(env, ns) if g[3]) < groups:
            return None
        try:
            url, model = resolve_url(env.cluster.state_dir, "k3", ns)
            return (url, model) if requests.get(f"{url}/health", timeout=2).status_code == 200 else None
        except Exception:  # noqa: BLE001 - not there yet
            return None
    return wait_for(answering, WAIT_S, f"{groups} Ready group(s) and the deployment's endpoint")


class Load:
    """Closed-loop users on the deployment's front until stopped; every result kept."""

    def __init__(self, url: str, model: str | None, users: int = 4):
        self.url, self.model, self.users = url, model, users
        self.results: list[Any] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    async def _run(self) -> None:
        while not self._stop.is_set():
            self.results += await run_load(self.url, [Phase(3.0, concurrency=self.users, prompt_tokens=128,
                                                            output_tokens=64)], model=self.model, drain_s=30.0)

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(60)


def deployment(env: DevEnv, ns: str, replicas: int, **spec: Any) -> dict[str, Any]:
    cr = env.deployment(ns, replicas=replicas)
    cr["metadata"]["annotations"] = {"inference.kimik3.io/sim-load-time": f"{LOAD_S:g}s"}  # simulator only
    cr["spec"].update(spec)
    return cr


def patch_spec(env: DevEnv, ns: str, spec: dict[str, Any]) -> None:
    env.rest.call("PATCH", env.cr_path(ns), body={"spec": spec}, content_type="application/merge-patch+json")


def rolled_out(env: DevEnv, ns: str, old: str, groups: int) -> dict[str, Any] | None:
    status = (env.get_cr(ns) or {}).get("status") or {}
    rollout = status.get("rollout") or {}
    progressing = next((c for c in status.get("conditions", []) if c["type"] == "Progressing"), {})
    now = snapshot(env, ns)
    done = (len(now) == groups and all(g[3] and g[2] != old for g in now) and progressing.get("status") == "False"
            and len(rollout.get("revisions") or []) == 1)
    return status if done else None


def rollout_under_load(env: DevEnv, ns: str, groups: int, **rollout: Any) -> tuple[list, list, float, str]:
    """Apply ``groups`` groups, change the image under load; returns (samples, results, seconds, old revision)."""
    env.apply(deployment(env, ns, groups, **({"rollout": rollout} if rollout else {})))
    url, model = serving(env, ns, groups)
    (old,) = {g[2] for g in snapshot(env, ns)}
    with Load(url, model) as load, Recorder(lambda: snapshot(env, ns), period_s=0.1) as rec:
        time.sleep(1.0)
        start = time.monotonic()
        patch_spec(env, ns, {"engine": {"image": NEW_IMAGE}})
        wait_for(lambda: rolled_out(env, ns, old, groups), WAIT_S + groups * 4 * LOAD_S, "the rollout to finish")
        took = time.monotonic() - start
        time.sleep(1.0)
    return rec.values, load.results, took, old


def test_one_group_image_change_serves_throughout(env, ns):
    samples, results, took, old = rollout_under_load(env, ns, 1)
    summary = summarize(results)["total"]
    assert summary["requests"] > 20 and summary["errors"] == 0, summary
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
          f"{summary['requests']} requests, {summary['errors']} failed")


def test_three_groups_keep_three_ready(env, ns):
    samples, results, took, _ = rollout_under_load(env, ns, 3, maxSurge=1)
    summary = summarize(results)["total"]
    assert summary["errors"] == 0, summary
    fewest = min(sum(1 for g in s if g[3]) for s in samples)
    assert fewest >= 3, [s for s in samples if sum(1 for g in s if g[3]) < 3][:3]
    print(f"\nthree groups: rollout took {took:.1f} s ({took / LOAD_S:.1f} load times), fewest Ready {fewest}")


def test_labels_annotations_and_replicas_change_no_pod(env, ns):
    env.apply(deployment(env, ns, 1))
    serving(env, ns, 1)
    before = snapshot(env, ns)
    lws_path = f"/apis/leaderworkerset.x-k8s.io/v1/namespaces/{ns}/leaderworkersets/k3-engine"
    lws_generation = env.rest.get(lws_path)["metadata"]["generation"]
    env.rest.call("PATCH", env.cr_path(ns), content_type="application/merge-patch+json",
                  body={"metadata": {"labels": {"team": "inference"}, "annotations": {"note": "edited"}}})
    time.sleep(3.0)  # the operator reconciles the edit within a second (watch event)
    assert snapshot(env, ns) == before
    assert env.rest.get(lws_path)["metadata"]["generation"] == lws_generation
    env.scale(ns, 2)
    serving(env, ns, 2)
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
    env.apply(cr)
    url, model = serving(env, ns, 1)
    ((_, uid, old, _),) = snapshot(env, ns)
    with Load(url, model) as load, Recorder(lambda: snapshot(env, ns), period_s=0.2) as rec:
        patch_spec(env, ns, {"engine": {"env": [{"name": "KIMIK3_SIM_SLOWDOWN", "value": "2"}]}})
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
    print(f"\nrolled back: {message}")


def _rolled_back(env: DevEnv, ns: str) -> dict[str, Any] | None:
    rollout = ((env.get_cr(ns) or {}).get("status") or {}).get("rollout") or {}
    return rollout if rollout.get("rolledBack") else None
