"""Output parity (``controller.parity``): the comparison (first diverging token, mismatch rate,
threshold), when parity must hold (model and drafter revisions, lossy speculative sampling), the
golden prompts from a ConfigMap, and rounds against simulated engines answering greedily
(``kimik3_dev.sim``: a corrupting release, the benign divergence of healthy groups)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from kimik3.admission import admit
from kimik3.controller.completions import Completion, Completions, leader_url
from kimik3.controller.kube import api_error
from kimik3.controller.reconcile import named
from kimik3.kube.kinds import CONFIG_MAP
from kimik3.controller.parity import (GOLDEN_PROMPTS, Parity, ParityUnavailable, first_divergence, judge,
                                      served_model, skip_reason)
from kimik3.render.configmap import group_plan_document
from kimik3_dev.sim.divergence import BENIGN_DIVERGENCE
from kimik3_dev.sim.engine import EngineConfig, token_id, token_text
from support.engines import SimEngines
from support.recipes import recipe


@pytest.mark.parametrize(("canary", "reference", "at"), [
    ((1, 2, 3), (1, 2, 3), None),
    ((1, 2, 9, 4), (1, 2, 3, 4), 2),
    ((5,), (1,), 0),
    ((1, 2), (1, 2, 3), 2),  # an output that ends early differs where it ends
    ((), (1,), 0),
])
def test_first_diverging_token(canary, reference, at):
    assert first_divergence(canary, reference) == at


def outputs(n: int, diverging: dict[int, int]) -> tuple[list[Completion], list[Completion]]:
    """``n`` reference outputs and canary outputs that leave them at ``diverging[prompt] = token``."""
    ref = [Completion(tuple(token_id(i) for i in range(8)), tuple(token_text(i) for i in range(8)))] * n
    canary = [Completion(tuple(token_id(i, diverging.get(p), 3) for i in range(8)),
                         tuple(token_text(i, diverging.get(p), 3) for i in range(8))) for p in range(n)]
    return canary, ref


def test_the_threshold_is_a_share_of_the_prompts_and_the_first_mismatch_is_quoted():
    prompts = [f"prompt {i}" for i in range(16)]
    at_limit = judge(prompts, *outputs(16, {2: 5, 7: 0, 9: 1, 15: 7}), 0.25, "canary group c-0 and old group o-0")
    assert (at_limit.result, at_limit.prompts, len(at_limit.mismatches), at_limit.rate) == ("Passed", 16, 4, 0.25)
    over = judge(prompts, *outputs(16, {2: 5, 7: 0, 9: 1, 15: 7, 3: 4}), 0.25, "canary group c-0 and old group o-0")
    assert (over.result, len(over.mismatches), over.rate) == ("Failed", 5, 5 / 16)
    first = over.mismatches[0]
    assert (first.prompt, first.position) == ("prompt 2", 5)
    assert first.canary == f'{json.dumps(token_text(5, 5, 3))} (id {token_id(5, 5, 3)})'
    assert first.reference == f'{json.dumps(token_text(5))} (id {token_id(5)})'
    assert over.message == ("output parity: 5 of 16 golden prompt(s) differ (31.2%, limit parity.maxMismatchRate 25.0%) "
                            "between canary group c-0 and old group o-0; first: prompt \"prompt 2\" diverges at output "
                            f"token 5: canary {first.canary}, old group {first.reference}")
    same = judge(prompts, *outputs(16, {}), 0.0, "x")
    assert (same.result, same.mismatches, same.rate) == ("Passed", (), 0.0)


def plan(**spec) -> dict:
    return group_plan_document(admit(recipe(**spec)["spec"]))


def canary_admitted(canary: dict | None = None, **spec):
    return admit(recipe(rollout={"canary": {"groups": 1, **(canary or {})}}, **spec)["spec"])


def test_parity_is_skipped_when_the_model_or_drafter_revision_changes():
    admitted = canary_admitted()
    assert skip_reason(admitted, plan(), plan()) is None
    assert served_model(plan())[0] == "/models/moonshotai/Kimi-K3/main"
    new_model = plan(model={"revision": "c0ffee"})
    why = skip_reason(admitted, new_model, plan())
    assert why is not None and why.startswith("parity skipped: the model revision changes (model ") and "c0ffee" in why
    new_drafter = plan(speculativeDecoding={"draftRevision": "d2"})
    why = skip_reason(admitted, new_drafter, plan())
    assert why is not None and "drafter" in why and "d2" in why
    # block verification and the other drafter sampling keep greedy outputs exact: not skipped
    assert skip_reason(admitted, plan(speculativeDecoding={"rejectionSampleMethod": "standard"}), plan()) is None
    assert skip_reason(canary_admitted({"parity": {"enabled": False}}), plan(), plan()) == \
        "parity skipped: spec.rollout.canary.parity.enabled is false"
    keyed = canary_admitted(service={"apiKeySecret": {"name": "k", "key": "key"}})
    assert "spec.service.apiKeySecret is set" in (skip_reason(keyed, plan(), plan()) or "")


def test_golden_prompts_come_from_the_configmap_in_key_order():
    stored = {("ns", "prompts"): {"data": {"b": "second prompt", "a": "first prompt", "c": "  "}},
              ("ns", "empty"): {"data": {}}}
    parity = Parity(Completions().greedy, lambda ns, name: stored.get((ns, name)))
    assert parity.prompts("ns", canary_admitted()) == list(GOLDEN_PROMPTS) and len(GOLDEN_PROMPTS) == 16
    assert parity.prompts("ns", canary_admitted({"parity": {"configMap": "prompts"}})) == \
        ["first prompt", "second prompt"]
    with pytest.raises(ParityUnavailable, match=r"spec.rollout.canary.parity.configMap: ConfigMap ns/missing does "
                                                r"not exist: create it"):
        parity.prompts("ns", canary_admitted({"parity": {"configMap": "missing"}}))
    with pytest.raises(ParityUnavailable, match="ConfigMap ns/empty has no prompt"):
        parity.prompts("ns", canary_admitted({"parity": {"configMap": "empty"}}))

    def forbidden(ns: str, name: str) -> dict:
        raise api_error(403, "Forbidden", json.dumps({"kind": "Status", "message": "configmaps \"p\" is forbidden"}))
    with pytest.raises(ParityUnavailable, match=r"reading ConfigMap ns/p: HTTP 403 Forbidden: configmaps \"p\" is "
                                                r"forbidden \(the operator lists configmaps"):
        Parity(Completions().greedy, forbidden).prompts("ns", canary_admitted({"parity": {"configMap": "p"}}))


@pytest.fixture(scope="module")
def engines() -> Iterator[SimEngines]:
    with SimEngines() as running:
        yield running


def test_rounds_against_simulated_engines(engines):
    """A healthy canary under the simulator's benign divergence passes; a corrupting release with
    its latency unchanged fails, quoting the prompt and its first diverging token; an engine that
    refuses the requests leaves the round unanswered."""
    admitted = canary_admitted()
    old = engines.start(EngineConfig(group_name="k3-engine-0", benign_divergence=BENIGN_DIVERGENCE))
    healthy = engines.start(EngineConfig(group_name="k3-engine-6d9f0a00-0", benign_divergence=BENIGN_DIVERGENCE))
    corrupt = engines.start(EngineConfig(group_name="k3-engine-6d9f0a00-0", benign_divergence=BENIGN_DIVERGENCE,
                                         corrupt_rate=0.6))
    keyed = engines.start(EngineConfig(api_keys=("secret",)))
    parity = Parity(Completions().greedy, lambda ns, name: None)
    passed = parity.round("ns", "k3", admitted, [("k3-engine-6d9f0a00-0", healthy.url)], ("k3-engine-0", old.url))
    assert passed.result == "Passed" and passed.prompts == 16 and passed.rate is not None and passed.rate <= 0.25
    failed = parity.round("ns", "k3", admitted, [("k3-engine-6d9f0a00-0", corrupt.url)], ("k3-engine-0", old.url))
    assert failed.result == "Failed" and failed.rate is not None and failed.rate > 0.25, failed.message
    first = failed.mismatches[0]
    assert first.prompt in GOLDEN_PROMPTS and f"prompt {json.dumps(first.prompt)} diverges at output token " \
        f"{first.position}: canary " in failed.message
    assert "between canary group(s) k3-engine-6d9f0a00-0 and old group k3-engine-0 over 32 token(s)" in failed.message
    refused = parity.round("ns", "k3", admitted, [("k", keyed.url)], ("k3-engine-0", old.url))
    assert refused.result == "Unanswered" and "HTTP 401" in refused.message
    assert leader_url("http://10.0.0.7:8000/metrics") == "http://10.0.0.7:8000"


@pytest.mark.tier("apiserver")
def test_the_prompts_configmap_is_read_from_the_api_server_by_a_list(kube, namespace):
    """The operator lists ConfigMaps (its RBAC grants no get on them): the prompts ConfigMap is
    found by a list with a field selector (``reconcile.named``)."""
    kube.request("POST", f"/api/v1/namespaces/{namespace}/configmaps", body={
        "metadata": {"name": "golden"}, "data": {"02": "second prompt", "01": "first prompt"}})
    kube.request("POST", f"/api/v1/namespaces/{namespace}/configmaps", body={
        "metadata": {"name": "golden-other"}, "data": {"01": "not this one"}})
    parity = Parity(Completions().greedy, lambda ns, name: named(kube, CONFIG_MAP, ns, name))
    assert parity.prompts(namespace, canary_admitted({"parity": {"configMap": "golden"}})) == \
        ["first prompt", "second prompt"]
    with pytest.raises(ParityUnavailable, match=f"ConfigMap {namespace}/gone does not exist"):
        parity.prompts(namespace, canary_admitted({"parity": {"configMap": "gone"}}))
