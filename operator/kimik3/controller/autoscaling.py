"""Autoscaling inside the reconcile: when a decision is due, observe, decide, report.

``Autoscaling.step(obj, admitted, sets, groups)`` returns the replicas to render and the status
fields, condition and Events that tell the story (an ``AutoscalerReport``: status.desiredReplicas,
status.decode, status.lastScale, condition MetricsAvailable). It keeps one ``LatencyPolicy`` per
deployment in memory (its learned model and recommendation history); after an operator restart
the model starts again from the seed and the replicas from status.desiredReplicas, so nothing
scales on a restart.
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kimik3.admission import Admitted
from kimik3.api.conditions import ConditionType, Event, EventReason, EventType, Reason, Verdict
from kimik3.api.v1alpha1 import DecodeStatus, ScaleEvent
from kimik3.autoscaler.factory import latency_policy, policy_settings
from kimik3.autoscaler.observation import DecodeObservation, MetricsUnavailable
from kimik3.autoscaler.policy import Decision, FleetState, LatencyPolicy
from kimik3.autoscaler.sources import MetricSource, PodScrapeSource, PrometheusSource, ScrapeTarget
from kimik3.controller import metrics
from kimik3.controller.fleet import EngineSet, fleet_replicas
from kimik3.controller.status import AutoscalerReport, stored_conditions
from kimik3.kube.labels import KUEUE_JOB_UID_LABEL
from kimik3.kube.groups import Group, GroupKey
from kimik3.kube.pods import group_index, is_leader, is_ready, is_unschedulable, phase, ready_since
from kimik3.kube.times import rfc3339, rfc3339_seconds
from kimik3.kube.workloads import waiting

SLO_WINDOW_S = 3600.0
"""Decisions over this past window count toward the SLO-attainment gauge."""

ScrapeURL = Callable[[dict[str, Any], int], str]

HOLD_EVENTS: dict[EventReason, EventType] = {
    EventReason.GROUPS_LOADING: "Normal", EventReason.UNPLACEABLE: "Warning",
    EventReason.METRICS_UNAVAILABLE: "Warning", EventReason.METRICS_INCOMPLETE: "Warning"}
"""Decisions that hold the groups and still post an Event (of this type); a scale always posts a Normal one."""


def pod_ip_url(pod: dict[str, Any], port: int) -> str:
    """A leader's /metrics in a real cluster: its pod IP."""
    return f"http://{pod.get('status', {}).get('podIP', '')}:{port}/metrics"


def source_key(admitted: Admitted) -> tuple[str, str | None, int]:
    """(metrics source type, Prometheus URL, engine port) of spec.autoscaling.metricsSource: a
    change needs a new ``metric_source``."""
    spec = admitted.spec
    return spec.autoscaling.metrics_source.type, spec.autoscaling.metrics_source.prometheus_url, spec.service.port


def metric_source(admitted: Admitted, pods: Callable[[], list[dict[str, Any]]], scrape_url: ScrapeURL,
                  clock: Callable[[], float]) -> MetricSource:
    """The source spec.autoscaling.metricsSource names: Prometheus at its URL, or the group
    leaders' /metrics (``scrape_url`` of each Running leader among ``pods()``, read at each
    observation) on the engine port. The autoscaler and the idle clock (``controller.idle``) both
    read their engines through it."""
    m = admitted.spec.autoscaling.metrics_source
    if m.type == "prometheus":
        return PrometheusSource(m.prometheus_url or "")
    port = admitted.spec.service.port

    def targets(namespace: str, name: str) -> list[ScrapeTarget]:
        return [ScrapeTarget(p["metadata"].get("uid", p["metadata"]["name"]), group_index(p) or "0",
                             scrape_url(p, port)) for p in pods() if is_leader(p) and phase(p) == "Running"]
    return PodScrapeSource(targets, clock=clock)


def load_seconds(members: list[dict[str, Any]], load_timeout_s: float) -> float | None:
    """Seconds a serving group took to load: from its first pod's ``creationTimestamp`` to its
    last pod's Ready transition (``kube.pods.ready_since``). None when a time is missing, or the
    span is past the load timeout: the startup probe would have failed such a load, so the span
    holds a later readiness flap or container restart, not a load."""
    created = [rfc3339_seconds(p["metadata"].get("creationTimestamp")) for p in members]
    ready = [rfc3339_seconds(ready_since(p)) for p in members]
    if not members or any(t is None for t in created + ready):
        return None
    span = max(t for t in ready if t is not None) - min(t for t in created if t is not None)
    return span if 0 <= span <= load_timeout_s else None


def fleet_state(sets: list[EngineSet], current: int, groups: Mapping[GroupKey, Group], load_timeout_s: float,
                now: float, workloads: list[dict[str, Any]] | None = None) -> FleetState:
    """Groups asked for (``current``: the fleet's replicas, ``controller.fleet.fleet_replicas``),
    ready (``status.readyReplicas`` of every live LeaderWorkerSet, at most ``current``), loading (not
    ready: not created yet, or leader younger than the load timeout; and every group beyond
    ``current``: the surge of a rollout) and unplaceable (a pod ``kube.pods.is_unschedulable``,
    or under placement kueue a group whose Workload Kueue refused: quota used up, no rack fits,
    preempted; ``kube.workloads.waiting``). A group past its load timeout counts as neither:
    failed. ``serving``: the indexes of the groups with every pod Ready (during a rollout two
    LeaderWorkerSets each have a group 0: the metric series name groups by index only).

    ``groups``: the groups of the sets' pods (``kube.groups.groups_of``).

    A rollout's target groups replace old groups one for one as they turn Ready
    (``controller.fleet``), so the groups beyond ``current`` count as loading, never as capacity.
    ``load_time_s``: the shortest ``load_seconds`` of the serving groups (a flap or restart
    after the load only lengthens a group's span)."""
    running = [s for s in sets if not s.deleting]
    uids = {s.lws["metadata"].get("uid"): s.name for s in running}
    refused = {(uids.get((w_obj["metadata"].get("labels") or {}).get(KUEUE_JOB_UID_LABEL)), w.group)
               for w_obj in workloads or [] for w in [waiting(w_obj)] if w is not None and w.why != "pending"}
    loading = unplaceable = 0
    serving = set()
    loads: list[float] = []
    for engine_set in running:
        for index in range(engine_set.replicas):
            found = groups.get((engine_set.name, index))
            group = list(found.pods) if found is not None else []
            if (engine_set.name, str(index)) in refused or any(is_unschedulable(p) for p in group):
                unplaceable += 1
            elif not group:
                loading += 1  # the LeaderWorkerSet has not created it yet
            elif all(is_ready(p) for p in group):
                serving.add(str(index))
                loaded = load_seconds(group, load_timeout_s)
                if loaded is not None:
                    loads.append(loaded)
            else:
                leader = next((p for p in group if is_leader(p)), group[0])
                created = rfc3339_seconds(leader["metadata"].get("creationTimestamp"))
                if created is None or now - created < load_timeout_s:
                    loading += 1
    ready = min(sum(int((s.lws.get("status") or {}).get("readyReplicas") or 0) for s in running), current)
    given = sum(s.replicas for s in running)
    surge = max(0, given - current)
    loading += max(0, current - given)  # asked for, not yet given to a set (a scale-up during a canary bake)
    loading = min(loading, max(0, current - ready - unplaceable)) + surge
    return FleetState(current=current, ready=ready, loading=loading, unplaceable=unplaceable,
                      serving=frozenset(serving), load_time_s=min(loads, default=None))


def within_bounds(decision: Decision, low: int, high: int) -> Decision:
    """``decision`` kept inside spec.autoscaling's ``[low, high]`` groups. The policy holds the
    groups running on many paths (groups loading, a rollout's surge, no whole scale-down window
    yet, a new policy after a settings change); a bound moved past them (maxReplicas lowered,
    also mid-rollout) takes effect at the next decision, reason ``ReplicaBounds``."""
    desired = min(max(decision.desired, low), high)
    if desired == decision.desired:
        return decision
    bound = "maxReplicas" if desired < decision.desired else "minReplicas"
    return Decision(desired, EventReason.REPLICA_BOUNDS, f"spec.autoscaling.{bound} is {desired} "
                    f"(the policy said {decision.desired}: {decision.reason}: {decision.message})",
                    decision.recommendation)


def told(decision: Decision, current: int, now: float) -> tuple[ScaleEvent | None, list[Event]]:
    """status.lastScale and the Events of a decision from ``current`` groups at ``now`` (unix
    seconds): a change, or a hold whose reason a user must hear (``HOLD_EVENTS``)."""
    reason = EventReason(decision.reason)
    if decision.desired != current:
        last_scale = ScaleEvent.model_validate({"time": rfc3339(now), "from": current, "to": decision.desired,
                                                "reason": f"{decision.reason}: {decision.message}"[:1024]})
        return last_scale, [Event("Normal", reason, f"groups {current} -> {decision.desired}: {decision.message}")]
    if reason in HOLD_EVENTS:
        return None, [Event(HOLD_EVENTS[reason], reason, f"holding {current} group(s): {decision.message}")]
    return None, []


@dataclass
class DeploymentState:
    policy: LatencyPolicy
    source_key: tuple[str, str | None, int]
    """(metrics source type, Prometheus URL, engine port): a change builds a new source."""
    source: MetricSource
    last_decision: float = 0.0
    slo: deque[tuple[float, bool]] = field(default_factory=deque)
    """(unix seconds, within the target) of each decision that measured the latency, the last hour's."""
    pods: list[dict[str, Any]] = field(default_factory=list)
    """The deployment's pods as of the current step (the pod-scrape source reads the leaders)."""
    unmeasured_since: dict[str, float] = field(default_factory=dict)
    """Serving groups the last reading lacked, and since when (unix seconds)."""


@dataclass
class Scaled:
    """One autoscaling step: the replicas to render and what the status and Events say."""

    replicas: int
    report: AutoscalerReport
    """What goes into the status."""
    events: list[Event]
    requeue_after: float


class Autoscaling:
    """Autoscaler state of every deployment this operator reconciles."""

    def __init__(self, scrape_url: ScrapeURL = pod_ip_url, clock: Callable[[], float] = time.time):
        self.scrape_url = scrape_url
        self.clock = clock
        self._states: dict[tuple[str, str], DeploymentState] = {}
        self._latency_series: dict[tuple[str, str], tuple[str, str]] = {}
        """(metric, percentile) labels of each deployment's observed-latency gauge."""

    def forget(self, namespace: str, name: str) -> None:
        self._states.pop((namespace, name), None)
        series = self._latency_series.pop((namespace, name), None)
        if series is not None:
            metrics.OBSERVED_LATENCY.remove(namespace, name, *series)
        _within_target((namespace, name), None, None)

    def _state(self, key: tuple[str, str], admitted: Admitted) -> DeploymentState:
        wanted = source_key(admitted)
        settings = policy_settings(admitted)
        state = self._states.get(key)
        if state is None or state.source_key != wanted or state.policy.settings != settings:
            state = DeploymentState(latency_policy(admitted), wanted, metric_source(
                admitted, lambda: self._states[key].pods, self.scrape_url, self.clock))
            self._states[key] = state
        return state

    def step(self, obj: dict[str, Any], admitted: Admitted, sets: list[EngineSet],
             groups: Mapping[GroupKey, Group], workloads: list[dict[str, Any]] | None = None) -> Scaled:
        """The replicas to render now for the deployment's LeaderWorkerSets ``sets`` and their
        ``groups``, and what to report. Decides at most once per interval."""
        meta = obj["metadata"]
        key = (meta["namespace"], meta["name"])
        status = obj.get("status") or {}
        spec, seconds = admitted.spec, admitted.seconds
        a = spec.autoscaling
        interval = seconds.autoscaling_interval
        now = self.clock()
        state = self._state(key, admitted)
        state.pods = [p for g in groups.values() for p in g.pods]
        fleet_now = fleet_replicas(sets)
        current = fleet_now if fleet_now is not None else int(status.get(
            "desiredReplicas", min(max(spec.replicas, a.min_replicas), a.max_replicas)) or 0)
        held = status.get("desiredReplicas", current)
        held = min(max(held, a.min_replicas), a.max_replicas)
        if now - state.last_decision < interval:
            measured = any(c.type == ConditionType.METRICS_AVAILABLE for c in stored_conditions(obj))
            waiting = None if measured else Verdict("Unknown", Reason.NOT_YET_MEASURED,
                                                    "waiting for the first decision")
            return Scaled(held, AutoscalerReport(held, metrics=waiting), [],
                              max(1.0, interval - (now - state.last_decision)))
        state.last_decision = now
        fleet = fleet_state(sets, current if fleet_now is not None else held, groups, seconds.load_timeout, now,
                            workloads)
        obs: DecodeObservation | None
        try:
            obs = state.source.observe(key[0], key[1], seconds.autoscaling_window)
            reading = self._reading(state, obs, fleet, now)
        except MetricsUnavailable as exc:
            obs = None
            reading = Verdict("False", exc.reason, f"{exc.message}; holding replicas at {fleet.current}")
        if obs is None and fleet.current == 0 and a.min_replicas == 0:
            decision = Decision(0, EventReason.SCALED_TO_ZERO, "no groups run: nothing to measure")
            reading = Verdict("True", Reason.SCALED_TO_ZERO, "no groups run; no traffic is a valid reading")
        else:
            decision = within_bounds(state.policy.decide(now, obs, fleet), a.min_replicas, a.max_replicas)
        decode = None
        if obs is not None and obs.has_traffic:
            decode = self._measured(state, key, admitted, obs, now)
        else:
            _within_target(key, None, None)
        while state.slo and state.slo[0][0] < now - SLO_WINDOW_S:
            state.slo.popleft()
        if state.slo:
            metrics.SLO_ATTAINMENT.labels(namespace=key[0], deployment=key[1]).set(
                sum(ok for _, ok in state.slo) / len(state.slo))
        metrics.DESIRED_GROUPS.labels(namespace=key[0], deployment=key[1]).set(decision.desired)
        metrics.CURRENT_GROUPS.labels(namespace=key[0], deployment=key[1]).set(fleet.ready)
        metrics.DECISIONS.labels(reason=decision.reason).inc()
        last_scale, events = told(decision, fleet.current, now)
        return Scaled(decision.desired, AutoscalerReport(decision.desired, decode, last_scale, reading), events,
                      interval)

    @staticmethod
    def _reading(state: DeploymentState, obs: DecodeObservation, fleet: FleetState, now: float) -> Verdict:
        """MetricsAvailable for a reading: which serving groups it lacks and since when (kept in
        ``state.unmeasured_since``), so missing data never passes for low load unsaid."""
        unmeasured = fleet.serving - obs.groups
        short = (fleet.serving & obs.groups) - obs.covered
        state.unmeasured_since = {g: state.unmeasured_since.get(g, now) for g in unmeasured}
        if unmeasured or short:
            since = ", ".join(f"{g} (since {rfc3339(state.unmeasured_since[g])})"
                              for g in sorted(unmeasured, key=lambda g: (len(g), g)))
            partly = ", ".join(sorted(short, key=lambda g: (len(g), g)))
            lacks = "; ".join([f"no metrics from group(s) {since}"] * bool(unmeasured) + [
                f"the counters of group(s) {partly} do not cover the window (a first sample, back after a gap, "
                "or reset)"] * bool(short))
            return Verdict("True", Reason.GROUPS_UNMEASURED,
                           f"{obs.itl_metric} from {len(fleet.serving & obs.groups)} of {len(fleet.serving)} serving "
                           f"group(s); {lacks}: never scaling down on this reading")
        return Verdict("True", Reason.MEASURED, f"{obs.itl_metric} from {len(obs.groups)} group(s)"
                       if obs.has_traffic else "no traffic in the window (a valid reading)")

    def _measured(self, state: DeploymentState, key: tuple[str, str], admitted: Admitted,
                  obs: DecodeObservation, now: float) -> DecodeStatus:
        """status.decode of a window with traffic; also sets the observed-latency gauge and
        records the window toward the SLO attainment."""
        target, q = admitted.spec.autoscaling.target, admitted.target_quantile
        latency = obs.latency_quantile(target.metric, q)
        if latency is not None:
            series = (target.metric, str(target.percentile))
            previous = self._latency_series.get(key)
            if previous is not None and previous != series:  # the target changed: drop the old series
                metrics.OBSERVED_LATENCY.remove(*key, *previous)
            self._latency_series[key] = series
            metrics.OBSERVED_LATENCY.labels(*key, *series).set(latency)
        ttft_target, ttft_limit = admitted.spec.autoscaling.ttft_target, admitted.seconds.ttft_target
        ttft_percentile = ttft_target.percentile if ttft_target is not None else target.percentile
        ttft = obs.ttft_quantile(ttft_percentile / 100)
        latency_ok = None if latency is None else latency <= admitted.seconds.latency_target
        ttft_ok = None if ttft_limit is None or ttft is None else ttft <= ttft_limit
        _within_target(key, latency_ok, ttft_ok)
        if latency_ok is not None:
            state.slo.append((now, latency_ok and ttft_ok is not False))
        return DecodeStatus(metric=target.metric, percentile=target.percentile, latency_seconds=latency,
                            above_top_bucket=obs.above_top_bucket(q) or None,
                            tokens_per_second_per_user=obs.tokens_per_second_per_user(q),
                            acceptance_length=round(obs.acceptance_length, 3),
                            ttft_seconds=ttft, ttft_percentile=ttft_percentile if ttft is not None else None,
                            observed_at=rfc3339(now))


def _within_target(key: tuple[str, str], latency_ok: bool | None, ttft_ok: bool | None) -> None:
    """``kimik3_latency_within_target`` of the deployment ``key``: target ``latency`` and ``ttft``
    set to 1/0, or removed where the window measured nothing (None: no token decoded, no first
    token, or no TTFT target)."""
    for target, ok in (("latency", latency_ok), ("ttft", ttft_ok)):
        if ok is None:
            with contextlib.suppress(KeyError):
                metrics.LATENCY_WITHIN_TARGET.remove(*key, target)
        else:
            metrics.LATENCY_WITHIN_TARGET.labels(*key, target).set(int(ok))
