"""Canary bake, promotion and rollback (``controller.rollout.Rollouts``), step by step on one
reconcile's inputs: the stored status, the rendered LeaderWorkerSet, the deployment's live ones
and their pods. The
analysis here returns given figures; tests/e2e/test_e2e_rollout.py reads them from the simulated
engines of a release made 2x slower."""

from __future__ import annotations

import copy

from prometheus_client import REGISTRY

from kimik3.admission import admit
from kimik3.api.conditions import Reason
from kimik3.controller.canary import Analysis, Check
from kimik3.kube.groups import groups_of
from kimik3.controller.fleet import engine_sets
from kimik3.controller.rollout import Rollouts, scale_down_held
from kimik3.render.revision import TEMPLATE_HASH_ANNOTATION
from support.recipes import recipe
from support.rendering import by_kind, render_cr
from test_rollout_status import FIRST, NEW, OLD, group

CANARY = {"groups": 1, "bake": "60s", "analysis": {"interval": "10s", "failureLimit": 2, "maxLatency": "5ms"},
          "parity": {"enabled": False}}  # output parity: tests/test_rollout_parity.py


class Figures(Analysis):
    """Checks that return the next of ``results``: (passed, P90 seconds), or a ``Check`` as it is."""

    def __init__(self, results):
        super().__init__(lambda pod, port: "")
        self.results = list(results)
        self.revisions: list[str] = []

    def check(self, namespace, name, admitted, revision, pods):
        self.revisions.append(revision)
        if isinstance(self.results[0], Check):
            return self.results.pop(0)
        passed, latency = self.results.pop(0)
        verdict = "passed" if passed else "failed"
        return Check("Passed" if passed else "Failed", latency, 0.0,
                     f"revision {revision} {verdict} a check: P90 {latency * 1000:.2f} ms", 100.0)


class Clock:
    def __init__(self):
        self.now = 1_800_000_000.0

    def __call__(self):
        return self.now


def setup(image: str):
    cr = recipe(uid="u1", replicas=1, rollout={"canary": CANARY}, engine={"image": image})
    cr["metadata"]["generation"] = 2
    return cr, admit(cr["spec"]), by_kind(render_cr(cr).objects, "LeaderWorkerSet")


def failed_checks(cr: dict) -> float:
    """kimik3_canary_checks_total{result="Failed"} of ``cr`` in this process (0 before any)."""
    labels = {"namespace": cr["metadata"]["namespace"], "deployment": cr["metadata"]["name"], "result": "Failed"}
    return REGISTRY.get_sample_value("kimik3_canary_checks_total", labels) or 0.0


def template_hash(lws: dict) -> str:
    return lws["metadata"]["annotations"][TEMPLATE_HASH_ANNOTATION]


def upgrade():
    """The edit v0.33.0 -> v0.33.1 of a one-group deployment under a canary: the CR asking for
    v0.33.1 and its admission, the LeaderWorkerSet each release renders, the canary's name."""
    _, _, old_lws = setup("vllm/vllm-openai:v0.33.0")
    cr, admitted, new_lws = setup("vllm/vllm-openai:v0.33.1")
    return cr, admitted, old_lws, new_lws, f"{FIRST}-{template_hash(new_lws)[:8]}"


def live(*named: tuple[str, dict, int], pods: list[dict]) -> tuple[list, dict]:
    """A step's view of the cluster: the EngineSets of LeaderWorkerSets (name, rendered body,
    replicas), oldest first, as applied, and the groups of ``pods``."""
    lwss = []
    for minute, (name, body, replicas) in enumerate(named):
        obj = copy.deepcopy(body)
        obj["metadata"] |= {"name": name, "uid": f"uid-{name}", "creationTimestamp": f"2026-12-01T00:0{minute}:00Z"}
        obj["spec"]["replicas"] = replicas
        lwss.append(obj)
    groups = groups_of(pods, 2)
    return engine_sets(lwss, groups), groups


def old_group_only(old_lws: dict) -> tuple[list, dict]:
    """The old LeaderWorkerSet with its one group Ready: the cluster when the edit comes."""
    return live((FIRST, old_lws, 1), pods=group(0, OLD, True))


def canary_beside(old_lws: dict, new_lws: dict, canary: str) -> tuple[list, dict]:
    """The old group and, in its own LeaderWorkerSet, the canary's group, both Ready."""
    pods = group(0, OLD, True) + group(0, NEW, True, canary)
    return live((FIRST, old_lws, 1), (canary, new_lws, 1), pods=pods)


def remember(cr, step):
    cr["status"] = {"rollout": {"canary": step.canary.model_dump(by_alias=True) if step.canary else None,
                                "rolledBack": step.rolled_back.model_dump(by_alias=True) if step.rolled_back else None,
                                "progress": step.progress.model_dump(by_alias=True) if step.progress else None}}


def applied(step) -> list[tuple[str, int, str]]:
    """(name, replicas, template hash) of each LeaderWorkerSet the step applies."""
    return [(b["metadata"]["name"], b["spec"]["replicas"], template_hash(b)) for b in step.fleet.apply]


def test_a_slow_canary_is_rolled_back_and_held_back():
    cr, admitted, old_lws, new_lws, canary = upgrade()
    a, b = template_hash(old_lws), template_hash(new_lws)
    clock, figures = Clock(), Figures([(False, 0.0104), (False, 0.0098)])
    rollouts = Rollouts(figures, clock)
    failed_before = failed_checks(cr)
    # the change: one canary group in a new LeaderWorkerSet beside the old group
    step = rollouts.step(cr, admitted, new_lws, *old_group_only(old_lws))
    assert applied(step) == [(FIRST, 1, a), (canary, 1, b)] and step.fleet.delete == []
    assert step.fleet.apply[0]["spec"]["leaderWorkerTemplate"] == old_lws["spec"]["leaderWorkerTemplate"]
    assert [e[1] for e in step.events] == ["CanaryStarted"]
    assert step.verdict.reason == Reason.CANARY_ANALYSIS and "waiting for the canary group" in step.verdict.message
    remember(cr, step)
    # the canary group is Ready: the bake starts, the first check fails; the old group stays
    both = canary_beside(old_lws, new_lws, canary)
    step = rollouts.step(cr, admitted, new_lws, *both)
    assert applied(step) == [(FIRST, 1, a), (canary, 1, b)]
    assert (step.canary.revision, step.canary.checks, step.canary.failed_checks) == (NEW, 1, 1)
    assert figures.revisions == [NEW]
    assert step.verdict.reason == Reason.CANARY_ANALYSIS and "1 failed (rollback at 2)" in step.verdict.message
    remember(cr, step)
    clock.now += 5  # within the interval: no check
    step = rollouts.step(cr, admitted, new_lws, *both)
    assert step.canary.checks == 1
    clock.now += 5
    step = rollouts.step(cr, admitted, new_lws, *both)
    # the second failure: the canary's LeaderWorkerSet goes; the old group never stopped
    assert step.rolled_back is not None and step.rolled_back.revision == NEW
    assert failed_checks(cr) - failed_before == 2  # kimik3_canary_checks_total{result="Failed"}: each check once
    assert step.rolled_back.restored_revision == OLD
    assert applied(step) == [(FIRST, 1, a)] and step.fleet.delete == [canary]
    assert (step.verdict.status, step.verdict.reason) == ("False", Reason.ROLLED_BACK)
    assert "P90 9.80 ms" in step.verdict.message and "after 2 failed check(s) of 2" in step.verdict.message
    assert [e[:2] for e in step.events] == [("Warning", "RolledBack")]
    remember(cr, step)
    # while the spec still asks for the failed release, it is not created again
    clock.now += 600
    step = rollouts.step(cr, admitted, new_lws, *old_group_only(old_lws))
    assert applied(step) == [(FIRST, 1, a)]
    assert step.verdict.reason == Reason.ROLLED_BACK and step.rolled_back is not None
    # a new edit rolls out again
    cr2, admitted2, newer = setup("vllm/vllm-openai:v0.33.2")
    cr2["status"] = cr["status"]
    step = rollouts.step(cr2, admitted2, newer, *old_group_only(old_lws))
    assert step.rolled_back is None and [e[1] for e in step.events] == ["CanaryStarted"]
    assert len(step.fleet.apply) == 2


def test_a_canary_that_passes_its_bake_is_promoted():
    cr, admitted, old_lws, new_lws, canary = upgrade()
    clock = Clock()
    rollouts = Rollouts(Figures([(True, 0.004)] * 7), clock)
    remember(cr, rollouts.step(cr, admitted, new_lws, *old_group_only(old_lws)))
    both = canary_beside(old_lws, new_lws, canary)
    for _ in range(6):
        step = rollouts.step(cr, admitted, new_lws, *both)
        assert not step.canary.promoted and step.fleet.delete == []
        remember(cr, step)
        clock.now += 10
    step = rollouts.step(cr, admitted, new_lws, *both)
    assert step.canary.promoted and step.canary.failed_checks == 0 and step.canary.checks == 7  # at 0, 10, .. 60 s
    assert [e[1] for e in step.events] == ["CanaryPromoted"]
    assert step.fleet.delete == [FIRST]  # the canary group is Ready: the old one goes
    remember(cr, step)
    step = rollouts.step(cr, admitted, new_lws, *both)
    assert step.verdict is None and step.fleet.delete == [FIRST]


def test_a_revert_during_a_canary_needs_no_canary_and_keeps_every_serving_group():
    """Review finding: reverting to the templates the old groups run must not canary them (a
    failed check would refuse the known-good revision) nor shrink them to canary.groups."""
    cr, _, old_lws = setup("vllm/vllm-openai:v0.33.0")  # the spec back at the old groups' release
    _, _, _, new_lws, canary = upgrade()
    cr["spec"]["replicas"] = 3
    admitted = admit(cr["spec"])
    old_lws["spec"]["replicas"] = 3
    pods = group(0, OLD, True) + group(1, OLD, True) + group(2, OLD, True) + group(0, NEW, False, canary)
    step = Rollouts(Figures([]), Clock()).step(cr, admitted, old_lws,
                                               *live((FIRST, old_lws, 3), (canary, new_lws, 1), pods=pods))
    assert applied(step) == [(FIRST, 3, template_hash(old_lws))] and step.fleet.delete == [canary]
    assert step.events == [] and step.canary is None


def test_paused_holds_the_templates_and_every_group():
    cr, _, old_lws, new_lws, _ = upgrade()
    cr["spec"]["rollout"] = {"paused": True}
    admitted = admit(cr["spec"])
    step = Rollouts(Figures([]), Clock()).step(cr, admitted, new_lws, *old_group_only(old_lws))
    assert applied(step) == [(FIRST, 1, template_hash(old_lws))]
    assert step.fleet.apply[0]["spec"]["leaderWorkerTemplate"] == old_lws["spec"]["leaderWorkerTemplate"]
    assert step.verdict.reason == Reason.PAUSED and "a change of the group templates waits" in step.verdict.message


def test_a_restarted_operator_plans_the_same_leaderworkersets_mid_canary():
    """F16: the rollout keeps its memory in status.rollout and the LeaderWorkerSets, so a new
    operator (a fresh ``Rollouts``) applies them byte for byte as the old one did."""
    cr, admitted, old_lws, new_lws, canary = upgrade()
    clock = Clock()
    first = Rollouts(Figures([(True, 0.004)] * 3), clock)
    remember(cr, first.step(cr, admitted, new_lws, *old_group_only(old_lws)))
    both = canary_beside(old_lws, new_lws, canary)
    remember(cr, first.step(cr, admitted, new_lws, *both))
    clock.now += 3
    again = first.step(cr, admitted, new_lws, *both)
    restarted = Rollouts(Figures([]), clock).step(cr, admitted, new_lws, *both)
    assert restarted.fleet == again.fleet and len(restarted.fleet.apply) == 2


def test_no_scale_down_mid_rollout_but_a_scale_up_or_a_lower_maximum_goes_ahead():
    assert scale_down_held(Reason.ROLLOUT_IN_PROGRESS, 3, 2, 4) == 3
    assert scale_down_held(Reason.CANARY_ANALYSIS, 3, 1, 4) == 3
    assert scale_down_held(Reason.SURGE_BLOCKED, 3, 1, 4) == 3
    assert scale_down_held(Reason.ROLLOUT_IN_PROGRESS, 3, 4, 4) is None
    assert scale_down_held(Reason.STABLE, 3, 2, 4) is None
    # maxReplicas lowered to 2 mid-rollout: the autoscaler's 2 (or 1) keeps 2, not 3
    assert scale_down_held(Reason.ROLLOUT_IN_PROGRESS, 3, 2, 2) is None
    assert scale_down_held(Reason.ROLLOUT_IN_PROGRESS, 3, 1, 2) == 2


QUIET = Check("NoTraffic", None, None, "no traffic on revision 6d9f0a in the window: nothing to judge", 0.0)
DOWN = Check("SourceUnreadable", None, None, "no reading of revision 6d9f0a from Prometheus at http://prom:9090 "
             "(PrometheusUnreachable: http://prom:9090: ConnectError)")


def bake(rollouts, cr, admitted, new_lws, cluster, clock, times):
    """``times`` reconciles 10 s apart (the analysis interval), the status kept between them; the last step."""
    for _ in range(times):
        step = rollouts.step(cr, admitted, new_lws, *cluster)
        remember(cr, step)
        clock.now += 10
    return step


def test_a_canary_without_traffic_is_not_promoted_until_min_checks_pass():
    """Issue 25 item 1: a bake with no traffic used to promote on zero checks. minChecks (3 by
    default) passing checks are needed; windows without traffic judge nothing, and the bake goes
    on past ``bake`` until the evidence is there."""
    cr, admitted, old_lws, new_lws, canary = upgrade()
    assert admitted.spec.rollout.canary.analysis.min_checks == 3
    clock = Clock()
    rollouts = Rollouts(Figures([QUIET] * 8 + [(True, 0.004)] * 3), clock)
    remember(cr, rollouts.step(cr, admitted, new_lws, *old_group_only(old_lws)))
    both = canary_beside(old_lws, new_lws, canary)
    step = bake(rollouts, cr, admitted, new_lws, both, clock, 8)  # 0 .. 70 s: past the 60 s bake
    assert not step.canary.promoted and step.fleet.delete == [] and step.canary.checks == 0
    assert step.verdict.reason == Reason.CANARY_ANALYSIS
    assert "baked 70/60 s but 0/3 passing check(s) (analysis.minChecks)" in step.verdict.message
    assert [h.result for h in step.canary.history] == ["NoTraffic"] * 8
    step = bake(rollouts, cr, admitted, new_lws, both, clock, 2)
    assert not step.canary.promoted and step.canary.checks == 2
    step = rollouts.step(cr, admitted, new_lws, *both)
    assert step.canary.promoted and step.canary.checks == 3 and step.fleet.delete == [FIRST]
    assert [e[1] for e in step.events] == ["CanaryPromoted"]
    assert len(step.canary.history) == 10  # bounded: the 11 checks' newest 10
    assert [h.result for h in step.canary.history[-3:]] == ["Passed"] * 3
    assert step.canary.history[-1].latency_seconds == 0.004 and step.canary.history[-1].requests == 100.0


def test_an_unreadable_metric_source_pauses_the_rollout_and_never_promotes():
    """Issue 25 item 1: with the source down the bake has no evidence: Progressing=False
    MetricSourceUnreadable quotes the source and its error, however long the bake; once it reads
    again the passing checks it had count, and the canary is promoted."""
    cr, admitted, old_lws, new_lws, canary = upgrade()
    clock = Clock()
    rollouts = Rollouts(Figures([(True, 0.004)] * 3 + [DOWN] * 5 + [(True, 0.004)]), clock)
    remember(cr, rollouts.step(cr, admitted, new_lws, *old_group_only(old_lws)))
    both = canary_beside(old_lws, new_lws, canary)
    step = bake(rollouts, cr, admitted, new_lws, both, clock, 8)  # 3 passes, then the source goes down
    assert not step.canary.promoted and step.canary.checks == 3 and step.fleet.delete == []
    assert applied(step) == [(FIRST, 1, template_hash(old_lws)), (canary, 1, template_hash(new_lws))]
    assert (step.verdict.status, step.verdict.reason) == ("False", Reason.METRIC_SOURCE_UNREADABLE)
    assert "the canary analysis is paused: no reading of revision 6d9f0a from Prometheus at http://prom:9090 " \
           "(PrometheusUnreachable: http://prom:9090: ConnectError)" in step.verdict.message
    assert "3/3 passing check(s)" in step.verdict.message
    assert [(e[0], e[1]) for e in step.events] == [("Warning", "MetricSourceUnreadable")]
    assert step.requeue_after == 10
    step = rollouts.step(cr, admitted, new_lws, *both)
    assert step.canary.promoted and step.canary.checks == 4


def test_the_real_analysis_tells_an_unreachable_source_from_a_quiet_window():
    """``Analysis.check`` against a Prometheus nobody listens on: SourceUnreadable, naming the URL."""
    cr, admitted, _, _, _ = upgrade()
    cr["spec"]["autoscaling"] = {"metricsSource": {"type": "prometheus", "prometheusUrl": "http://127.0.0.1:9"}}
    admitted = admit(cr["spec"])
    check = Analysis(lambda pod, port: "").check("ns", "k3", admitted, "6d9f0a", [])
    assert check.result == "SourceUnreadable" and not check.judged
    assert check.message.startswith("no reading of revision 6d9f0a from Prometheus at http://127.0.0.1:9 "
                                    "(PrometheusUnreachable: http://127.0.0.1:9")
    cr["spec"]["autoscaling"] = {"metricsSource": {"type": "podScrape"}}
    check = Analysis(lambda pod, port: "").check("ns", "k3", admit(cr["spec"]), "6d9f0a", [])
    assert check.result == "NoReading" and "NoTargets" in check.message  # no leader of the revision yet
