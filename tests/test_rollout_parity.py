"""Output parity and probe requests in the canary bake (``controller.rollout.Rollouts``), step by
step as tests/test_rollout_canary.py steps it, with the latency checks given but the golden prompts
and probes sent for real to simulated engines (``kimik3_dev.sim``) standing at the old group's and
the canary group's leaders: a corrupting release with unchanged latency is rolled back quoting the
prompt and the first diverging token, a healthy one under the simulator's benign divergence is
promoted, a model revision change skips parity and says so, a canary without traffic gets probes."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from prometheus_client import REGISTRY

from kimik3.admission import admit
from kimik3.api.conditions import Reason
from kimik3.controller.canary import Analysis, Check
from kimik3.controller.rollout import Rollouts
from kimik3.kube.labels import LWS_NAME_LABEL
from kimik3_dev.sim.divergence import BENIGN_DIVERGENCE
from kimik3_dev.sim.engine import EngineConfig
from support.engines import SimEngines
from support.recipes import recipe
from support.rendering import by_kind, render_cr
from test_rollout_canary import Clock, applied, live, remember, template_hash
from test_rollout_status import FIRST, NEW, OLD, group

CANARY = {"groups": 1, "bake": "20s", "analysis": {"interval": "10s", "failureLimit": 2, "maxLatency": "5ms",
                                                  "minChecks": 2}}


class Measured(Analysis):
    """Latency checks that return the next of ``results`` ("Passed" or "NoTraffic"); probes and
    parity real, each leader addressed as the engine of its LeaderWorkerSet (``urls``)."""

    def __init__(self, results: list[str], urls: dict[str, str]):
        super().__init__(lambda pod, port: urls[pod["metadata"]["labels"][LWS_NAME_LABEL]] + "/metrics")
        self.results = list(results)

    def check(self, namespace, name, admitted, revision, pods):
        result = self.results.pop(0)
        if result == "NoTraffic":
            return Check("NoTraffic", None, None, f"no traffic on revision {revision} in the window", 0.0)
        return Check("Passed", 0.004, 0.0, f"revision {revision} passed a check: P90 4.00 ms", 100.0)


def release(**spec):
    cr = recipe(uid="u1", replicas=1, rollout={"canary": CANARY}, **spec)
    cr["metadata"]["generation"] = 2
    objects = render_cr(cr).objects
    launcher = next(o for o in objects if o["kind"] == "ConfigMap" and "-launcher-" in o["metadata"]["name"])
    return cr, admit(cr["spec"]), by_kind(objects, "LeaderWorkerSet"), launcher


@pytest.fixture(scope="module")
def engines() -> Iterator[SimEngines]:
    with SimEngines() as running:
        yield running


def bake(engines: SimEngines, canary_config: dict, results: list[str], old_spec: dict | None = None,
         new_spec: dict | None = None):
    """The edit of a one-group deployment, its canary Ready beside the old group, each served by a
    simulated engine with the simulator's benign divergence (the canary's also ``canary_config``);
    yields each step of the bake, every 10 s, until a rollback or a promotion."""
    _, _, old_lws, old_cm = release(**(old_spec or {"engine": {"image": "vllm/vllm-openai:v0.33.0"}}))
    cr, admitted, new_lws, new_cm = release(**(new_spec or {"engine": {"image": "vllm/vllm-openai:v0.33.1"}}))
    canary = f"{FIRST}-{template_hash(new_lws)[:8]}"
    old = engines.start(EngineConfig(group_name=f"{FIRST}-0", benign_divergence=BENIGN_DIVERGENCE))
    new = engines.start(EngineConfig(group_name=f"{canary}-0", benign_divergence=BENIGN_DIVERGENCE, **canary_config))
    clock = Clock()
    rollouts = Rollouts(Measured(results, {FIRST: old.url, canary: new.url}), clock)
    launchers = [old_cm, new_cm]
    remember(cr, rollouts.step(cr, admitted, new_lws, *live((FIRST, old_lws, 1), pods=group(0, OLD, True)),
                               None, launchers))
    both = live((FIRST, old_lws, 1), (canary, new_lws, 1), pods=group(0, OLD, True) + group(0, NEW, True, canary))
    steps = []
    for _ in range(6):
        step = rollouts.step(cr, admitted, new_lws, *both, None, launchers)
        steps.append(step)
        if step.rolled_back is not None or (step.canary is not None and step.canary.promoted):
            break
        remember(cr, step)
        clock.now += 10
    return steps, canary, (template_hash(old_lws), template_hash(new_lws)), new


def test_a_corrupting_release_with_unchanged_latency_is_rolled_back_by_parity(engines):
    steps, canary, (a, _), _ = bake(engines, {"corrupt_rate": 0.6}, ["Passed"] * 6)
    (step,) = steps  # the first check: latency passed, parity failed
    assert step.rolled_back is not None and step.rolled_back.reason == "RolledBack"
    assert (step.verdict.status, step.verdict.reason) == ("False", Reason.ROLLED_BACK)
    message = step.rolled_back.message
    assert f"rolled back to {OLD} by output parity: " in message
    mismatches = int(message.split("output parity: ")[1].split(" of 16 golden prompt(s) differ")[0])
    assert mismatches > 4, message  # over parity.maxMismatchRate 25%
    assert f"between canary group(s) {canary}-0 and old group {FIRST}-0 over 32 token(s)" in message
    assert "; first: prompt \"" in message and "\" diverges at output token " in message and ", old group \"" in message
    assert applied(step) == [(FIRST, 1, a)] and step.fleet.delete == [canary]  # the old group never stopped


def test_a_healthy_release_under_benign_divergence_is_promoted(engines):
    steps, _, _, _ = bake(engines, {}, ["Passed"] * 6)
    assert [s.canary.promoted for s in steps] == [False, False, True]  # bake 20 s: checks at 0, 10, 20 s
    parity = steps[-1].canary.parity
    assert parity.result == "Passed" and parity.rounds == parity.passed_rounds == 3
    assert parity.mismatch_rate is not None and parity.mismatch_rate <= 0.25 and parity.max_mismatch_rate == 0.25
    assert "; 1 passing parity round(s) of 1: output parity: " in steps[0].verdict.message


def test_a_model_revision_change_skips_parity_and_says_so(engines):
    steps, _, _, _ = bake(engines, {"corrupt_rate": 1.0}, ["Passed"] * 6,
                          old_spec={"model": {"revision": "r1"}}, new_spec={"model": {"revision": "r2"}})
    assert steps[-1].canary.promoted and steps[-1].rolled_back is None
    parity = steps[-1].canary.parity
    assert parity.result == "Skipped" and parity.rounds == 0
    assert parity.message.startswith("parity skipped: the model revision changes (model /models/") and "r1 -> " in \
        parity.message and "r2" in parity.message


def probes_sent(result: str) -> float:
    labels = {"namespace": "inference", "deployment": "k3-latency", "purpose": "traffic", "result": result}
    return REGISTRY.get_sample_value("kimik3_canary_probe_requests_total", labels) or 0.0


def test_a_canary_without_traffic_gets_bounded_probe_requests(engines):
    # the counters are the process's: other tests in this worker may have counted under these labels
    before, failed_before = probes_sent("ok"), probes_sent("failed")
    steps, _, _, new = bake(engines, {}, ["NoTraffic", "Passed", "Passed"])
    assert [s.canary.history[-1].result for s in steps] == ["NoTraffic", "Passed", "Passed"]
    assert [(s.canary.probing, s.canary.probe_requests) for s in steps] == [(True, 8), (True, 16), (True, 24)]
    assert steps[-1].canary.promoted and steps[-1].canary.checks == 2
    assert probes_sent("ok") - before == 24 and probes_sent("failed") - failed_before == 0
    finished = sum(c._value.get() for c in new.metrics.by_reason["length"].values())  # 8 probes + 16 prompts a check
    assert finished == 3 * (8 + 16)
