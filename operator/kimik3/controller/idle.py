"""Idle stop and explicit wake inside the reconcile (spec.idle.stopAfter).

``Idle.step(obj, admitted, groups)`` reads the deployment's engines through the autoscaler's
metric source (``controller.autoscaling.metric_source``) once per spec.autoscaling.interval, runs
its ``autoscaler.idle.IdleClock``, and says whether the deployment is stopped (``IdleStep``):
0 groups rendered, so no GPU is held, while the staging children stay and the weights stay
staged. What persists is in status.idle: when it stopped, at which generation, the wake estimate
(the load time measured on the groups that served before the stop), and the last wake. A stopped
deployment wakes on a ``kube.labels.WAKE_REQUESTED_ANNOTATION`` time at or after the stop
(``kimik3 wake``), or on any change of its spec (``metadata.generation``: ``kubectl scale``
through the scale subresource, an edit). It then returns to spec.replicas, or with autoscaling
to at least max(minReplicas, 1) group while the idle clock, restarted at the wake, runs.

The clock lives in memory: after an operator restart it starts again at the restart (a stop
comes later, never sooner); the stopped state itself is read back from the status.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kimik3.admission import Admitted
from kimik3.api.conditions import Event, EventReason, Reason, Verdict
from kimik3.api.v1alpha1 import IdleStatus
from kimik3.autoscaler.idle import IdleClock
from kimik3.autoscaler.observation import DecodeObservation, MetricsUnavailable
from kimik3.autoscaler.sources import MetricSource
from kimik3.controller.autoscaling import ScrapeURL, fleet_state, metric_source, pod_ip_url, source_key
from kimik3.controller.fleet import EngineSet, fleet_replicas
from kimik3.controller.kube import Kube
from kimik3.kube.kinds import KIMIK3_DEPLOYMENT
from kimik3.kube.groups import Group, GroupKey
from kimik3.kube.labels import WAKE_REQUESTED_ANNOTATION
from kimik3.kube.times import rfc3339, rfc3339_seconds


def wake_request(request: str | None) -> tuple[float | None, list[Event]]:
    """The wake annotation's time (epoch seconds; None when unset), or None and a Warning Event when it
    is not an RFC 3339 time."""
    try:
        return rfc3339_seconds(request), []
    except ValueError:
        return None, [Event("Warning", EventReason.WAKE_REQUEST_INVALID,
                            f"annotation {WAKE_REQUESTED_ANNOTATION}={request!r} is not an RFC 3339 time (e.g. "
                            "2026-12-05T02:00:00Z; kimik3 wake writes one): it wakes nothing")]


@dataclass
class IdleStep:
    """What the idle step decided for this reconcile."""

    stopped: bool = False
    """No group runs (replicas rendered 0); the autoscaler does not run meanwhile."""
    floor: int = 0
    """Fewest groups to render (1 or minReplicas after a wake, with autoscaling; else 0)."""
    status: IdleStatus | None = None
    """status.idle (None: spec.idle.stopAfter unset; status.idle stays as the CR holds it)."""
    verdict: Verdict | None = None
    """Condition Stopped (None: spec.idle.stopAfter unset)."""
    events: list[Event] = field(default_factory=list)
    requeue_after: float | None = None

    def replicas(self, autoscaled: int | None) -> int | None:
        """The groups to render: 0 while stopped, else the autoscaler's (``autoscaled``) raised
        to ``floor``, or None (spec.replicas) without autoscaling."""
        if self.stopped:
            return 0
        return None if autoscaled is None else max(autoscaled, self.floor)


@dataclass
class _Watch:
    """One deployment's idle clock and the source it reads."""

    clock: IdleClock
    source_key: tuple[str, str | None, int]
    source: MetricSource
    pods: list[dict[str, Any]] = field(default_factory=list)


def estimate_text(seconds: float | None) -> str:
    """The wake estimate as the condition and Events say it."""
    return (f"a wake serves in about {seconds:.0f}s (the load time measured before the stop)" if seconds is not None
            else "no load time was measured before the stop: a wake takes up to probes.loadTimeout")


def request_wake(kube: Kube, namespace: str, name: str, now: float | None = None, uid: str | None = None) -> IdleStatus:
    """Ask the operator to wake the KimiK3Deployment ``namespace/name``: its
    ``WAKE_REQUESTED_ANNOTATION`` set to ``now`` (unix seconds; None: the current time), which
    wakes it when stopped and restarts its idle clock otherwise. What ``kimik3 wake`` runs, and
    the activator on a request through the gateway (``controller.activator``), which passes the
    ``uid`` its route named: the API server then refuses the patch unless the object has that
    ``metadata.uid`` (a precondition). Returns status.idle as the CR holds it (``stoppedAt`` set:
    it was stopped, ``wakeEstimateSeconds`` the time to serve). Raises ``controller.kube.NotFound``
    when no such deployment exists, ``controller.kube.Invalid`` naming ``metadata.uid`` (immutable)
    when its uid is not ``uid``."""
    meta: dict[str, Any] = {"annotations": {WAKE_REQUESTED_ANNOTATION: rfc3339(now)}}
    if uid is not None:
        meta["uid"] = uid
    patched = kube.patch_merge(*KIMIK3_DEPLOYMENT.type_meta, namespace, name, {"metadata": meta})
    return IdleStatus.model_validate((patched.get("status") or {}).get("idle") or {})


def sleeps(admitted: Admitted, step: IdleStep, sets: list[EngineSet]) -> bool:
    """Whether the deployment's requests go to the wake endpoint (``render.wake``): spec.idle.stopAfter
    is set and no group serves, because it is stopped (``step``) or because its groups are still
    loading (after a wake, or before the first group ever served): no live LeaderWorkerSet counts a
    Ready group (``status.readyReplicas``, as status.readyReplicas and the autoscaler count them)."""
    ready = sum(int((s.lws.get("status") or {}).get("readyReplicas") or 0) for s in sets if not s.deleting)
    return admitted.seconds.idle_stop_after is not None and (step.stopped or ready == 0)


def stopped_verdict(obj: dict[str, Any], admitted: Admitted, idle: IdleStatus) -> Verdict:
    """Stopped=True IdleTimeout (also Ready's reason while stopped): since when, the wake estimate, how to wake."""
    meta = obj["metadata"]
    return Verdict("True", Reason.IDLE_TIMEOUT, f"stopped at {idle.stopped_at} after {admitted.spec.idle.stop_after} "
                   f"without a request: 0 groups, weights kept staged; {estimate_text(idle.wake_estimate_seconds)}; "
                   f"wake with `kimik3 wake {meta['name']} -n {meta['namespace']}` or kubectl scale")


class Idle:
    """Idle clocks of every deployment with spec.idle.stopAfter set."""

    def __init__(self, scrape_url: ScrapeURL = pod_ip_url, clock: Callable[[], float] = time.time):
        self.scrape_url = scrape_url
        self.clock = clock
        self._watches: dict[tuple[str, str], _Watch] = {}

    def forget(self, namespace: str, name: str) -> None:
        self._watches.pop((namespace, name), None)

    def step(self, obj: dict[str, Any], admitted: Admitted, sets: list[EngineSet], groups: Mapping[GroupKey, Group],
             workloads: list[dict[str, Any]] | None = None) -> IdleStep:
        """Stopped, woken or running, for the CR ``obj`` whose LeaderWorkerSets are ``sets``, with
        their ``groups`` (and Kueue ``workloads``). The serving groups (each must be in a quiet
        reading), the groups loading (the clock does not run while one loads: a wake whose load
        outlasts stopAfter does not stop again before it serves) and the wake estimate (the
        shortest load time of the serving groups) are the autoscaler's
        (``controller.autoscaling.fleet_state``)."""
        meta = obj["metadata"]
        key = (meta["namespace"], meta["name"])
        stop_after = admitted.seconds.idle_stop_after
        if stop_after is None:
            self.forget(*key)
            if not (obj.get("status") or {}).get("idle"):
                return IdleStep()
            return IdleStep(status=IdleStatus(), verdict=Verdict("False", Reason.ACTIVE,
                                                                 "spec.idle.stopAfter is unset: never stops"))
        now, generation = self.clock(), meta.get("generation")
        stored = IdleStatus.model_validate((obj.get("status") or {}).get("idle") or {})
        request = (meta.get("annotations") or {}).get(WAKE_REQUESTED_ANNOTATION)
        requested_at, invalid = wake_request(request)
        if rfc3339_seconds(stored.stopped_at) is not None:
            return self._while_stopped(obj, admitted, stored, request, requested_at, invalid, now)
        fleet = fleet_state(sets, fleet_replicas(sets) or 0, groups, admitted.seconds.load_timeout, now, workloads)
        watch = self._watch(key, admitted, now)
        for restart in (rfc3339_seconds(stored.woke_at), requested_at, now if fleet.loading else None):
            if restart is not None:
                watch.clock.restart(restart)
        interval = admitted.seconds.autoscaling_interval
        if watch.clock.read_at is None or now - watch.clock.read_at >= interval:
            watch.pods = [p for g in groups.values() for p in g.pods]
            watch.clock.read(now, self._observe(watch, key, admitted), fleet.serving)
        if watch.clock.due(now, stop_after):
            estimate = fleet.load_time_s
            status = IdleStatus(stopped_at=rfc3339(now), stopped_generation=generation,
                                wake_estimate_seconds=None if estimate is None else round(estimate, 1),
                                woke_at=stored.woke_at)
            self.forget(*key)
            return IdleStep(stopped=True, status=status, events=invalid + [Event(
                "Normal", EventReason.IDLE_TIMEOUT, f"stopped: no request for {admitted.spec.idle.stop_after} "
                f"(spec.idle.stopAfter); {fleet.current} group(s) removed, weights kept staged; "
                f"{estimate_text(status.wake_estimate_seconds)}", once=False)],
                verdict=stopped_verdict(obj, admitted, status))
        woke_at = rfc3339_seconds(stored.woke_at)
        woken_recently = woke_at is not None and now - woke_at < stop_after
        left = stop_after - watch.clock.idle_for(now)
        return IdleStep(floor=self._floor(admitted) if woken_recently else 0, status=stored,
                        verdict=self._active(admitted), events=invalid,
                        requeue_after=max(1.0, min(interval - (now - (watch.clock.read_at or now)), left)))

    def _while_stopped(self, obj: dict[str, Any], admitted: Admitted, stored: IdleStatus, request: str | None,
                       requested_at: float | None, invalid: list[Event], now: float) -> IdleStep:
        """A stopped deployment: woken by a spec change (its generation moved, e.g. kubectl scale) or a
        wake request at or after the stop, else still stopped."""
        meta = obj["metadata"]
        generation, stopped_at = meta.get("generation"), rfc3339_seconds(stored.stopped_at)
        why = (f"the spec changed (generation {stored.stopped_generation} -> {generation}, e.g. kubectl scale)"
               if generation != stored.stopped_generation else
               f"{WAKE_REQUESTED_ANNOTATION}={request}" if requested_at is not None and stopped_at is not None
               and requested_at >= stopped_at else None)
        if why is None:
            self.forget(meta["namespace"], meta["name"])
            return IdleStep(stopped=True, status=stored, events=invalid, verdict=stopped_verdict(obj, admitted, stored))
        woke = IdleStatus(woke_at=rfc3339(now))
        return IdleStep(floor=self._floor(admitted), status=woke, verdict=self._active(admitted), events=invalid + [
            Event("Normal", EventReason.WOKEN, f"woken by {why} (stopped since {stored.stopped_at}); "
                  f"{estimate_text(stored.wake_estimate_seconds)}", once=False)],
            requeue_after=admitted.seconds.autoscaling_interval)

    @staticmethod
    def _floor(admitted: Admitted) -> int:
        """Groups a wake brings back with autoscaling: minReplicas, at least 1 (0 without autoscaling:
        spec.replicas is rendered)."""
        a = admitted.spec.autoscaling
        return max(a.min_replicas, 1) if a.enabled else 0

    @staticmethod
    def _active(admitted: Admitted) -> Verdict:
        return Verdict("False", Reason.ACTIVE, f"stops after {admitted.spec.idle.stop_after} without a request "
                       "(spec.idle.stopAfter)")

    def _watch(self, key: tuple[str, str], admitted: Admitted, now: float) -> _Watch:
        wanted = source_key(admitted)
        watch = self._watches.get(key)
        if watch is None or watch.source_key != wanted:
            watch = _Watch(IdleClock(now), wanted, metric_source(admitted, lambda: self._watches[key].pods,
                                                                 self.scrape_url, self.clock))
            self._watches[key] = watch
        return watch

    @staticmethod
    def _observe(watch: _Watch, key: tuple[str, str], admitted: Admitted) -> DecodeObservation | None:
        """One reading over spec.autoscaling.window; None when the source cannot be read."""
        try:
            return watch.source.observe(key[0], key[1], admitted.seconds.autoscaling_window)
        except MetricsUnavailable:
            return None
