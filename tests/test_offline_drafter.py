"""Failure case F23: the engines load only local files; a drafter offline engines cannot load is refused.

The GB300 recipe named the DSpark drafter by hub id while its pods run with ``HF_HUB_OFFLINE=1``;
vLLM resolves a hub id offline only for the target (vllm#29706), so the engine exited at start.
Now the target and the drafter are folders of the model cache mounted at /models
(``kimik3.engine.weights``), and admission refuses a hub-id drafter under an offline source
(CEL twin ``drafter-local-when-offline``). tests/conformance/test_offline_drafter_vllm.py gives
the rendered value to vLLM 0.33's own SpeculativeConfig.
"""

from __future__ import annotations

import json

import pytest

from kimik3.admission import admit
from kimik3.api.errors import SpecErrors
from kimik3.api.v1alpha1 import CEL_RULES
from kimik3.engine.args import engine_env, rank_args
from kimik3.engine.weights import cache_artifacts
from support.recipes import recipe
from support.rendering import by_kind, render_cr

DSPARK = {"method": "dspark", "draftModel": "Inferact/Kimi-K3-DSpark", "numSpeculativeTokens": 7}


def leader_container(cr: dict) -> dict:
    lws = by_kind(render_cr(cr, compute_domains=False).objects, "LeaderWorkerSet")
    template = lws["spec"]["leaderWorkerTemplate"].get("leaderTemplate") or lws["spec"]["leaderWorkerTemplate"][
        "workerTemplate"]
    return template["spec"]["containers"][0] | {"volumes": template["spec"]["volumes"]}


def speculative(args: list[str]) -> dict:
    return json.loads(args[args.index("--speculative-config") + 1])


def test_flagship_recipe_loads_target_and_drafter_from_local_folders_offline():
    cr = recipe()
    admitted = admit(cr["spec"])
    args = rank_args(admitted.spec, admitted.plan, 0)
    assert args[0] == "/models/moonshotai/Kimi-K3/main"
    assert speculative(args) == {"method": "dspark", "model": "/models/Inferact/Kimi-K3-DSpark/main",
                                 "num_speculative_tokens": 7, "draft_sample_method": "probabilistic",
                                 "rejection_sample_method": "block"}
    assert "--revision" not in args  # the folder is one revision
    env = engine_env(admitted.spec, admitted.plan, admitted.seconds.load_timeout)
    assert env["HF_HUB_OFFLINE"] == "1" and env["TRANSFORMERS_OFFLINE"] == "1"
    container = leader_container(cr)
    assert {"name": "model", "mountPath": "/models", "readOnly": True} in container["volumeMounts"]
    assert {"name": "model", "persistentVolumeClaim": {"claimName": "kimi-k3-weights", "readOnly": True}} in \
        container["volumes"]
    assert {"name": "HF_HUB_OFFLINE", "value": "1"} in container["env"]


def test_each_artifact_is_staged_at_its_own_revision():
    spec = recipe(model={"revision": "a1b2c3d"}, speculativeDecoding={"draftRevision": "refs/pr/4"})["spec"]
    admitted = admit(spec)
    assert [(a.role, a.repo_id, a.revision, a.path) for a in cache_artifacts(admitted.spec)] == [
        ("target", "moonshotai/Kimi-K3", "a1b2c3d", "/models/moonshotai/Kimi-K3/a1b2c3d"),
        ("drafter", "Inferact/Kimi-K3-DSpark", "refs/pr/4", "/models/Inferact/Kimi-K3-DSpark/refs--pr--4")]
    args = rank_args(admitted.spec, admitted.plan, 0)
    assert args[0] == "/models/moonshotai/Kimi-K3/a1b2c3d"
    assert speculative(args)["model"] == "/models/Inferact/Kimi-K3-DSpark/refs--pr--4"
    assert "revision" not in speculative(args)  # offline: the folder is the revision


@pytest.mark.parametrize("source", [{"pvc": {"claimName": "kimi-k3-weights"}}, {"hostPath": {"path": "/raid/k3"}}])
def test_hub_id_drafter_under_an_offline_source_is_refused_naming_the_field_and_the_fix(source):
    with pytest.raises(SpecErrors) as refused:
        admit({"model": {"source": source}, "speculativeDecoding": DSPARK})
    [error] = refused.value.errors
    assert error.path == "spec.speculativeDecoding.draftModel"
    assert "Inferact/Kimi-K3-DSpark is a hub id" in error.message
    assert "Invalid repository ID or local directory specified" in error.message  # what vLLM would say
    assert "use spec.model.source.cache" in error.message and "/models/Kimi-K3-DSpark" in error.message
    assert "drafter-local-when-offline" in CEL_RULES


@pytest.mark.parametrize("source,drafter,expected_model", [
    ({"pvc": {"claimName": "w"}}, "/models/dspark", "/models/dspark"),  # a folder in the weights volume
    ({"hub": {}}, "Inferact/Kimi-K3-DSpark", "Inferact/Kimi-K3-DSpark"),  # online: vLLM downloads it
])
def test_drafters_an_engine_can_load_are_accepted(source, drafter, expected_model):
    admitted = admit({"model": {"source": source}, "speculativeDecoding": {**DSPARK, "draftModel": drafter,
                                                                           "draftRevision": "v2"}})
    sc = speculative(rank_args(admitted.spec, admitted.plan, 0))
    assert sc["model"] == expected_model
    assert sc.get("revision") == ("v2" if "hub" in source else None)


@pytest.mark.parametrize("drafter", ["/models/../etc/dspark", "/opt/dspark", "models/dspark"])
def test_a_drafter_path_outside_the_weights_volume_is_refused(drafter):
    with pytest.raises(SpecErrors, match="spec.speculativeDecoding.draftModel"):
        admit({"model": {"source": {"pvc": {"claimName": "w"}}}, "speculativeDecoding": {**DSPARK,
                                                                                        "draftModel": drafter}})


def test_a_cache_is_staged_from_the_hub_or_declared_ready_not_both():
    for cache in ({"claimName": "c"}, {"claimName": "c", "hub": {}, "declaredReady": True}):
        with pytest.raises(SpecErrors, match="spec.model.source.cache: set exactly one of hub"):
            admit({"model": {"source": {"cache": cache}}})
    assert admit({"model": {"source": {"cache": {"claimName": "c", "hub": {}}}}}).spec.model.source.cache
