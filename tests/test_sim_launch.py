"""The engine simulator starts from what the operator rendered (``kimik3_dev.sim.launch``): the
launcher ConfigMap's plan and the leader pod, made the way LeaderWorkerSet makes them from the
rendered LeaderWorkerSet, give the ``vllm serve`` argv; that argv, not the CR, decides how the
simulated engine behaves."""

from __future__ import annotations

import asyncio
import copy
import json
from typing import Any

import aiohttp
import pytest

from kimik3.admission import admit
from kimik3.autoscaler import perfmodel
from kimik3.autoscaler.perfmodel import EngineShape
from kimik3_dev.sim import podenv
from kimik3_dev.sim.engine import SimEngine
from kimik3_dev.sim.launch import Exit, Launch, LaunchUnresolved, engine_config, exit_of, launch
from support.lws_pods import group_pods
from support.recipes import RECIPE_FILES, recipe
from support.rendering import by_kind, launcher_name, render_cr

RECIPES = [p.name for p in RECIPE_FILES]
UID = "7a1c2b9e-0000-4000-8000-000000000002"


def leader_launch(objects: list[dict[str, Any]]) -> Launch:
    """The launch of group 0's leader, the ConfigMap read from ``objects``."""
    cm = by_kind(objects, "ConfigMap")
    lws = by_kind(objects, "LeaderWorkerSet")
    leader = group_pods(lws, lws["metadata"]["namespace"], 0)[0]
    return launch(leader, lambda name: cm if name == cm["metadata"]["name"] else None)


@pytest.mark.parametrize("name", RECIPES)
def test_the_rendered_argv_gives_the_engine_the_recipes_shape(name):
    """For every recipe, the engine read from the leader's argv has the shape, batch limits and
    served name the CR asks for (what the simulator took from the spec before)."""
    cr = recipe(name, uid=UID)
    admitted = admit(cr["spec"])
    started = leader_launch(render_cr(cr).objects)
    assert started.argv[:2] == ("vllm", "serve")
    assert started.group_size == admitted.plan.nodes_per_group
    config = engine_config(started.argv, started.accelerator, admitted.spec.model.variant)
    assert config.shape == EngineShape.from_spec(admitted.spec, admitted.plan)
    assert config.served_model_name == admitted.spec.model.served_model_name
    assert (config.max_num_seqs, config.max_num_batched_tokens) == (admitted.spec.engine.max_num_seqs,
                                                                     admitted.spec.engine.max_num_batched_tokens)
    assert config.max_model_len == (admitted.spec.model.max_model_len or 1048576)


def with_speculative_tokens(objects: list[dict[str, Any]], k: int) -> list[dict[str, Any]]:
    """``objects`` with the plan's ``--speculative-config`` saying ``k`` tokens, as an argument
    builder bug would render it (the CR is untouched)."""
    out = copy.deepcopy(objects)
    cm = by_kind(out, "ConfigMap")
    plan = json.loads(cm["data"]["plan.json"])
    for rank in plan["ranks"]:
        args = rank["args"]
        i = args.index("--speculative-config")
        args[i + 1] = json.dumps({**json.loads(args[i + 1]), "num_speculative_tokens": k})
    cm["data"]["plan.json"] = json.dumps(plan)
    return out


def measured_steps(config: Any) -> dict[str, float]:
    """Serve one 600-token completion; the engine's own spec-decode counters and step count."""
    async def main() -> dict[str, float]:
        engine = SimEngine(config)
        await engine.start()
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
                async with session.post(engine.url + "/v1/completions",
                                        json={"prompt": "hi", "max_tokens": 600}) as r:
                    assert r.status == 200, await r.text()
            m = engine.metrics
            counter = lambda short: m[short][0]._value.get()  # noqa: E731
            return {"drafts": counter("spec_decode_num_drafts"), "draft_tokens": counter("spec_decode_num_draft_tokens"),
                    "accepted": counter("spec_decode_num_accepted_tokens"), "positions": len(m.per_pos[0])}
        finally:
            await engine.stop()
    return asyncio.run(main())


def test_the_plans_start_back_off_is_the_launchs_start_delay():
    """A deployment whose groups keep failing (kimik3.controller.recreation) starts its engines late."""
    cr = recipe(uid=UID)
    assert leader_launch(render_cr(cr).objects).start_delay_s == 0
    assert leader_launch(render_cr(cr, start_delay_s=40).objects).start_delay_s == 40


@pytest.mark.parametrize("probes, expected", [
    ({}, Exit(35, 180, 245)),
    ({"periodSeconds": 2, "drainTimeout": "20s"}, Exit(11, 20, 61)),
    ({"drainTimeout": "0s"}, Exit(35, 0, 65)),
])
def test_how_the_engine_ends_is_read_from_the_rendered_pod(probes, expected):
    """The preStop hook's wait, vLLM's --shutdown-timeout and the grace period, as the pod has them."""
    assert leader_launch(render_cr(recipe(uid=UID, probes=probes)).objects).on_delete == expected


def test_a_pod_without_a_drain_ends_at_once():
    pod = {"spec": {"containers": [{"name": "engine"}]}}
    assert exit_of(pod["spec"], ["vllm", "serve", "m"]) == Exit(0, 0, 30)  # the API server's default grace


def test_a_changed_flag_in_the_rendered_argv_changes_the_simulated_engine():
    """numSpeculativeTokens 7 in the CR, 3 in the rendered --speculative-config: the engine drafts
    3 tokens a step and accepts fewer per step, whatever the CR says."""
    cr = recipe("gb300-tp8-megakernel-dspark.yaml", uid=UID)
    assert cr["spec"]["speculativeDecoding"]["numSpeculativeTokens"] == 7
    objects = render_cr(cr).objects
    engines = {}
    for k, objs in ((7, objects), (3, with_speculative_tokens(objects, 3))):
        started = leader_launch(objs)
        engines[k] = engine_config(started.argv, started.accelerator, seed=7, load_time_s=0.0, max_model_len=4096)
    assert (engines[7].shape.k, engines[3].shape.k) == (7, 3)
    seven, three = measured_steps(engines[7]), measured_steps(engines[3])
    assert seven["draft_tokens"] == 7 * seven["drafts"] and seven["positions"] == 7
    assert three["draft_tokens"] == 3 * three["drafts"] and three["positions"] == 3
    al7, al3 = 1 + seven["accepted"] / seven["drafts"], 1 + three["accepted"] / three["drafts"]
    model7, model3 = (perfmodel.acceptance_length("dspark", k) for k in (7, 3))
    assert al7 == pytest.approx(model7, rel=0.15) and al3 == pytest.approx(model3, rel=0.15)
    assert al3 <= 4 and al7 > al3 + 0.5  # fewer tokens per step: more steps for the same 600 tokens
    assert three["drafts"] > 1.3 * seven["drafts"]


def test_a_launch_the_pod_could_not_make_gives_no_engine():
    cr = recipe("gb300-tp8-megakernel-dspark.yaml", uid=UID)
    objects = render_cr(cr).objects
    lws = by_kind(objects, "LeaderWorkerSet")
    leader = group_pods(lws, "inference", 0)[0]
    cm = launcher_name(cr)
    with pytest.raises(LaunchUnresolved, match=f'configmap "{cm}" not found'):
        launch(leader, lambda name: None)
    with pytest.raises(LaunchUnresolved, match=f"couldn't find key plan.json in ConfigMap inference/{cm}"):
        launch(leader, lambda name: {"data": {"launcher.py": ""}})
    # the plan's --port is not the port the pod exposes: nothing would reach vLLM
    wrong_port = copy.deepcopy(objects)
    cm = by_kind(wrong_port, "ConfigMap")
    plan = json.loads(cm["data"]["plan.json"])
    args = plan["ranks"][0]["args"]
    args[args.index("--port") + 1] = "9000"
    cm["data"]["plan.json"] = json.dumps(plan)
    with pytest.raises(LaunchUnresolved, match="vLLM would listen on port 9000, the pod's http port is 8000"):
        leader_launch(wrong_port)
    # a group of 2 whose plan has one rank: the launcher exits 2
    short = copy.deepcopy(objects)
    cm = by_kind(short, "ConfigMap")
    plan = json.loads(cm["data"]["plan.json"])
    plan["ranks"] = plan["ranks"][:1]
    cm["data"]["plan.json"] = json.dumps(plan)
    with pytest.raises(LaunchUnresolved, match="the launcher exits 2: LWS_GROUP_SIZE=2 but the plan has 1 ranks"):
        leader_launch(short)
    with pytest.raises(LaunchUnresolved, match="vllm serve would refuse its arguments"):
        engine_config(["vllm", "serve", "m", "--speculative-config", "{not json"], "gb300")


def test_the_kubelet_view_of_env_and_files():
    pod = {"metadata": {"name": "p", "namespace": "ns", "uid": "u-1", "labels": {"w": "3"}},
           "spec": {"containers": [{"name": "engine", "volumeMounts": [
               {"name": "plan", "mountPath": "/etc/kimik3"}, {"name": "dshm", "mountPath": "/dev/shm"}]}],
               "volumes": [{"name": "plan", "configMap": {"name": "cm"}}, {"name": "dshm", "emptyDir": {}}]}}
    field = lambda path: {"name": "X", "valueFrom": {"fieldRef": {"fieldPath": path}}}  # noqa: E731
    resolve = lambda entry: podenv.resolve(entry, "ns", lambda _: None, pod["metadata"])  # noqa: E731
    assert [resolve(field(p)) for p in ("metadata.labels['w']", "metadata.labels['none']", "metadata.name",
                                        "metadata.uid")] == ["3", "", "p", "u-1"]
    with pytest.raises(podenv.EnvUnresolved, match="fieldRef status.podIP is not read"):
        resolve(field("status.podIP"))
    assert podenv.mounted_configmap_key(pod["spec"], "engine", "/etc/kimik3/plan.json") == ("cm", "plan.json")
    with pytest.raises(podenv.EnvUnresolved, match="not a ConfigMap volume"):
        podenv.mounted_configmap_key(pod["spec"], "engine", "/dev/shm/x")
    with pytest.raises(podenv.EnvUnresolved, match="no volume of container engine is mounted there"):
        podenv.mounted_configmap_key(pod["spec"], "engine", "/etc/other/plan.json")
