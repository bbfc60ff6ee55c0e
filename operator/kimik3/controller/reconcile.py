"""Level-based reconcile of one KimiK3Deployment: admit, read one snapshot, run the named steps, write.

``Reconciler.reconcile(namespace, name)`` reads the CR and makes the world match it. It is
idempotent and keeps no state between calls apart from which Events it already posted (and
``controller.grants``' notes of when to look at a wake ReferenceGrant), so a restarted operator,
a lost watch or a deleted child all converge by calling it again. It returns when to look again (``Result.requeue_after``, seconds). The spec is admitted once per reconcile
(``kimik3.admission.admit``); every step takes that one value and one snapshot of the cluster
(``controller.snapshot``), read before the applies and once more after them. The steps decide
(``controller.steps``); this module only does the writes they ask for. The wake ReferenceGrants
outlive any one deployment: ``controller.grants`` decides when each goes, told by every reconcile
what it found (a deployment gone, or no longer needing one) and sweeping them once in a while.

Teardown order (failure case F4): the CR carries the finalizer ``inference.kimik3.io/teardown``;
on deletion the LeaderWorkerSets go first, then, once no pod of the deployment is left holding
the ComputeDomain channel, the ComputeDomain, then the finalizer. The other children go by
garbage collection through their owner references.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from kimik3.admission import AdmissionPolicy, Admitted, admit
from kimik3.api.conditions import ConditionType, Event, EventReason
from kimik3.api.errors import SpecErrors
from kimik3.api.v1alpha1 import GroupStatus, KimiK3DeploymentStatus
from kimik3.controller import metrics, steps
from kimik3.controller.autoscaling import Autoscaling
from kimik3.controller.cache import ObjectCache, desired_hash
from kimik3.controller.capacity import Reprioritize, capacity_of, reserved_groups
from kimik3.controller.canary import Analysis
from kimik3.controller.fleet import EngineSet
from kimik3.controller.grants import WakeGrants
from kimik3.controller.idle import Idle, IdleStep, sleeps
from kimik3.controller.kube import ApiError, Kube, NotLeading
from kimik3.controller.nodes import Nodes
from kimik3.controller.placementmix import Placements
from kimik3.controller.queues import creating
from kimik3.controller.recreation import GroupFailures
from kimik3.controller.rollout import Rollouts
from kimik3.controller.snapshot import Reader
from kimik3.controller.staging import DEFAULT_STAGER_IMAGE, Staging
from kimik3.controller.status import Observed, invalid_status, lws_selector, merge_patch, status_patch, stored_conditions
from kimik3.controller.steps import Deletion, Outcome
from kimik3.kube.kinds import (CHILD_KINDS, CHILD_NEEDS, COMPUTE_DOMAIN, CONFIG_MAP, GROUP, HTTP_ROUTE, INFERENCE_POOL,
                               KIMIK3_DEPLOYMENT, LEADER_WORKER_SET, POD, POD_MONITOR, SERVED_BY, WORKLOAD, Kind, kind_of)
from kimik3.kube.groups import RESERVED, gpus_by_revision
from kimik3.kube.labels import DEPLOYMENT_LABEL
from kimik3.kube.objects import is_deleting
from kimik3.render.children import COMPUTE_DOMAIN_SKIPPED
from kimik3.render.meta import Owner
from kimik3.render.wake import GRANT_PREFIX, WakeEndpoint

FINALIZER = f"{GROUP}/teardown"
TEARDOWN_POLL_S = 3.0
log = logging.getLogger("kimik3.reconcile")


UNSERVED_FIX: dict[Kind, str] = {
    POD_MONITOR: "or set spec.monitoring.enabled: false",
    HTTP_ROUTE: "or remove spec.service.httpRoute",
    INFERENCE_POOL: "or set spec.routing.enabled: false",
    COMPUTE_DOMAIN: "or run the operator with --no-compute-domains (chart value computeDomains: false)",
}
"""The spec's (or the operator's) way around a child kind the cluster does not serve."""


def apply_failure(kind: Kind, name: str, exc: ApiError) -> str:
    """What a failed apply of child ``name`` says: the API server's status and message, and for a
    kind the API server does not serve (a 404 without a Status body: ``404 page not found``) who
    installs it (``kube.kinds.SERVED_BY``) and the spec's way around it (``UNSERVED_FIX``)."""
    if exc.status == 404 and not exc.is_status:
        return (f"{kind.kind} {name}: the API server does not serve {kind.api_version} {kind.kind} (404): install "
                f"{SERVED_BY.get(kind, 'its CRD')}{', ' + UNSERVED_FIX[kind] if kind in UNSERVED_FIX else ''}")
    return f"{kind.kind} {name}: {exc.status} {exc.reason}: {exc.message}"


@dataclass(frozen=True)
class Result:
    outcome: str
    """applied | apply-failed | invalid | tearing-down | deleted | gone"""
    requeue_after: float | None
    retry: bool = False
    """A child could not be applied (e.g. the LeaderWorkerSet webhooks are down): the work queue
    retries with its exponential back-off (1 s .. 5 min) instead of waiting for ``requeue_after``."""
    wake: tuple[tuple[str, str], ...] = ()
    """Other deployments (namespace, name) to reconcile now: their PlacementConflict does not say
    what this reconcile found of them (``controller.placementmix``)."""


def named(kube: Kube, kind: Kind, namespace: str, name: str) -> dict[str, Any] | None:
    """The object ``namespace/name`` of ``kind`` by a list with a field selector, None when none:
    the operator's RBAC lists ConfigMaps (its launchers) but does not get them, and a list by name
    needs no other verb (the golden prompts of ``controller.parity``)."""
    found = kube.list(*kind.type_meta, namespace, "", f"metadata.name={name}")
    return found[0] if found else None


class Reconciler:
    """Reconciles KimiK3Deployments through ``kube``."""

    def __init__(self, kube: Kube, compute_domains: bool = True, cache: ObjectCache | None = None,
                 policy: AdmissionPolicy = AdmissionPolicy(), autoscaling: Autoscaling | None = None,
                 failures: GroupFailures | None = None, stager_image: str = DEFAULT_STAGER_IMAGE,
                 wake: WakeEndpoint | None = None, namespaces: tuple[str, ...] = ()):
        self.kube = kube
        self.grants = None if wake is None else WakeGrants(kube, wake, namespaces)
        """The operator's wake Service (``kimik3 run --wake-service``; the HTTPRoute of a sleeping
        deployment goes there, ``render.wake``) and its ReferenceGrants for the watched ``namespaces``
        (all when empty; ``controller.grants``); None: routes never change for idleness."""
        self.failures = failures or GroupFailures()
        """Engine failures the pod watch saw (bounded recreation: Degraded and a start back-off)."""
        self.staging = Staging(kube, stager_image)
        """The weights gate: model caches staged before any engine pod (controller/staging.py)."""
        self.policy = policy
        self.autoscaling = autoscaling or Autoscaling()
        """Decode-latency autoscaler state of every deployment with spec.autoscaling.enabled."""
        self.idle = Idle(self.autoscaling.scrape_url, self.autoscaling.clock)
        """Idle clocks (spec.idle.stopAfter), reading through the autoscaler's metric source, on its clock."""
        self.rollouts = Rollouts(Analysis(self.autoscaling.scrape_url, self.autoscaling.clock,
                                          config_maps=lambda ns, name: named(kube, CONFIG_MAP, ns, name)),
                                 self.autoscaling.clock)
        """Pause, canary analysis, progress deadline and rollback (``controller.rollout``), on the autoscaler's clock."""
        self.cache = cache
        """What the watches saw; without it every read goes to the API server."""
        self.compute_domains = compute_domains
        """False in clusters without NVIDIA's DRA driver: no ComputeDomain or channel claims."""
        self.nodes = Nodes(kube)
        """Node labels (each tray's rack) and node lists (free trays)."""
        self.placements = Placements(policy)
        """Each deployment's placement mode and node pool, to find two modes on one pool (controller/placementmix.py)."""
        self.last_reader: Reader | None = None
        """The reads of the last reconcile (``Reader.reads``: by phase and kind)."""
        self._posted: dict[tuple[str, str], set[str]] = {}
        self._placed: dict[tuple[str, str], set[tuple[str, str]]] = {}
        """(rack, Kueue state) label pairs of ``kimik3_placement_groups`` set last, per deployment."""

    # -- entry point -------------------------------------------------------------------------
    def reconcile(self, namespace: str, name: str) -> Result:
        start = time.monotonic()
        try:
            # Inside the try: a failed read (API server unreachable) is a reconcile error too.
            if self.grants is not None:
                self.grants.sweep_due()
            obj = self.kube.get(*KIMIK3_DEPLOYMENT.type_meta, namespace, name)
            if obj is None:
                if self.grants is not None:
                    self.grants.gone(namespace, name)
                self._posted.pop((namespace, name), None)
                self.idle.forget(namespace, name)
                for state in ("desired", "ready"):
                    with contextlib.suppress(KeyError):
                        metrics.GROUPS.remove(namespace, name, state)
                self._placement_changed(namespace, name, [])
                metrics.GPU_TIME.remove(namespace, name)
                return Result("gone", None)
            result = self._teardown(obj) if is_deleting(obj) else self._apply(obj)
            if self.grants is not None:
                self.grants.seen(obj)
        except NotLeading:  # not an error: the replica that leads reconciles it
            raise
        except Exception:
            metrics.RECONCILES.labels(result="error").inc()
            raise
        metrics.RECONCILES.labels(result=result.outcome).inc()
        metrics.RECONCILE_SECONDS.observe(time.monotonic() - start)
        return result

    # -- create / update / resume: the steps -------------------------------------------------
    def _apply(self, obj: dict[str, Any]) -> Result:
        admitted = self._admit(obj)
        if admitted is None:
            return Result("invalid", None)
        obj = self._ensure_finalizer(obj)
        reader = self.last_reader = Reader(self.kube, self.cache, self.nodes, self.compute_domains)
        snap, out = reader.take(obj, admitted), Outcome()
        weights = out.add(steps.stage(snap, admitted, self.staging)).value
        crashes = out.add(steps.guard(snap, self.failures)).value
        idle = out.add(steps.idle(snap, admitted, self.idle)).value
        scaled = out.add(steps.scale(snap, admitted, self.autoscaling, idle.stopped)).value
        replicas = idle.replicas(None if scaled is None else scaled.replicas)
        asleep = self._wake_endpoint(obj, admitted, snap.sets, idle)
        rendered = out.add(steps.render_children(snap, admitted, replicas, crashes, self.compute_domains, asleep)).value
        rolled = out.add(steps.roll(snap, admitted, rendered, self.rollouts))
        new_groups = creating(snap.sets, rolled.apply) if admitted.spec.scheduling.placement.mode == "kueue" else None
        queue = reader.local_queue(admitted, snap.owner, new_groups) if new_groups is not None else None
        gated = out.add(steps.gate(snap, weights, rolled.apply, queue))
        failed = self._apply_children(obj, gated.apply)
        desired = int(next(c for c in rendered.objects if c["kind"] == LEADER_WORKER_SET.kind)["spec"]["replicas"])
        if LEADER_WORKER_SET.kind not in failed and not gated.value:
            self._delete(obj, out.add(steps.retire(rolled.value, desired)).delete)
        has_domain = any(c["kind"] == COMPUTE_DOMAIN.kind for c in rendered.objects)
        snap = reader.refresh(snap, admitted, has_domain)
        self._delete(obj, out.add(steps.prune(snap, rendered, not failed)).delete)
        now = dt.datetime.now(dt.timezone.utc)
        placed = out.add(steps.place(snap, admitted, now))
        self._delete(obj, placed.delete)
        self._reprioritize(obj, placed.value)
        prepare = out.add(steps.observe(snap, has_domain, now)).value
        routing = out.add(steps.route(snap, admitted)).value
        wake = tuple(out.add(steps.collide(snap, admitted, self.placements)).value)
        apply_error = "; ".join(failed.values()) or None
        observed = Observed(
            desired, target=next((s for s in snap.sets if s.name == rolled.value.fleet.target and not s.deleting),
                                 None),
            rendered=rendered.objects, apply_error=apply_error,
            compute_domain_note=None if self.compute_domains else COMPUTE_DOMAIN_SKIPPED,
            autoscaled=scaled.report if scaled is not None else None,
            crash_looping=out.conditions.get(ConditionType.DEGRADED),
            queue=out.conditions.get(ConditionType.SCALING_LIMITED),
            compute_domain=out.conditions.get(ConditionType.COMPUTE_DOMAIN_READY), rollout_step=rolled.value,
            routing=routing, routing_ready=out.conditions.get(ConditionType.ROUTING_READY),
            gateway=out.conditions.get(ConditionType.GATEWAY_READY),
            placement_conflict=out.conditions.get(ConditionType.PLACEMENT_CONFLICT),
            stopped=out.conditions.get(ConditionType.STOPPED), idle=idle.status)
        status = out.add(steps.report(snap, admitted, observed, weights, prepare)).value
        self._post(obj, out.events)
        self._write_status(obj, status)
        self._readiness_changed(obj, status, desired)
        self._placement_changed(snap.owner.namespace, snap.owner.name, status.groups or [])
        reserved = reserved_groups(admitted.spec)
        metrics.GPU_TIME.set(snap.owner.namespace, snap.owner.name, gpus_by_revision(
            snap.groups.values(), lambda index: capacity_of(reserved, index) or RESERVED))
        if apply_error:
            log.warning("reconcile of %s/%s: %s; retrying with back-off", snap.owner.namespace, snap.owner.name,
                        apply_error[:300])
            return Result("apply-failed", None, retry=True, wake=wake)
        return Result("applied", out.requeue_after, wake=wake)

    def _wake_endpoint(self, obj: dict[str, Any], admitted: Admitted, sets: list[EngineSet],
                       step: IdleStep) -> WakeEndpoint | None:
        """Where the HTTPRoute goes while the deployment sleeps (``controller.idle.sleeps``): the wake
        Service, once the ReferenceGrant in its namespace lets the route's namespace name it
        (``controller.grants``); None when awake, without a route or a wake Service, or when the grant
        could not be applied (a Warning Event says why: the route stays where it was)."""
        if self.grants is None or admitted.spec.service.http_route is None or not sleeps(admitted, step, sets):
            return None
        wake, namespace = self.grants.wake, obj["metadata"]["namespace"]
        if wake.namespace != namespace:
            try:
                self.grants.grant(namespace)
            except ApiError as exc:
                self._post(obj, [Event("Warning", EventReason.WAKE_ROUTE_REFUSED, (
                    f"ReferenceGrant {wake.namespace}/{GRANT_PREFIX}{namespace} could not be applied ({exc}): "
                    f"the HTTPRoute may not name the wake Service {wake}, so it stays on its backend and a "
                    "request through the gateway wakes nothing; install the Gateway API CRDs (ReferenceGrant) and "
                    f"let the operator apply ReferenceGrants in namespace {wake.namespace} (the chart's Role)"))])
                return None
        return wake

    def _admit(self, obj: dict[str, Any]) -> Admitted | None:
        """The admitted spec; None when refused (the status and an Event name every problem)."""
        try:
            return admit(obj.get("spec") or {}, self.policy)
        except SpecErrors as exc:
            problems = "; ".join(map(str, exc.errors))
            self._post(obj, [Event("Warning", EventReason.INVALID_SPEC, f"spec refused, nothing changed: {problems}")])
            self._write_status(obj, invalid_status(obj, problems))
            return None

    # -- the writes the steps ask for --------------------------------------------------------
    def _post(self, obj: dict[str, Any], events: list[Event]) -> None:
        """Post ``events`` on ``obj``; one marked ``once`` is posted once per generation, reason and message."""
        key = (obj["metadata"]["namespace"], obj["metadata"]["name"])
        seen = self._posted.setdefault(key, set())
        for event in events:
            token = f"{obj['metadata'].get('generation')}|{event.reason}|{event.message}"
            if event.once and token in seen:
                continue
            seen.add(token)
            self.kube.event(obj, event)

    def _apply_child(self, child: dict[str, Any]) -> dict[str, Any]:
        """Apply unless the watched object is still exactly what we applied for this desired state."""
        digest = desired_hash(child)
        if self.cache is not None and self.cache.unchanged(child, digest):
            meta = child["metadata"]
            seen = self.cache.get(child["apiVersion"], child["kind"], meta["namespace"], meta["name"])
            if seen is not None:
                metrics.APPLIES_SKIPPED.inc()
                return seen
        applied = self.kube.apply(child)
        metrics.CHILDREN_APPLIED.labels(kind=child["kind"]).inc()
        if self.cache is not None:
            self.cache.record_apply(applied, digest)
        return applied

    def _apply_children(self, obj: dict[str, Any], children: list[dict[str, Any]]) -> dict[str, str]:
        """Server-side apply each child in order; a child whose prerequisite failed (``CHILD_NEEDS``)
        waits for it. Returns why each kind failed ({} when every child applied)."""
        failed: dict[str, str] = {}
        for child in children:
            kind = kind_of(child["apiVersion"], child["kind"])
            missing = [k.kind for k in CHILD_NEEDS.get(kind, ()) if k.kind in failed]
            if missing:
                failed[child["kind"]] = (f"{child['kind']} {child['metadata']['name']}: not applied until the "
                                         f"{' and '.join(missing)} it needs is")
                continue
            try:
                self._apply_child(child)
            except ApiError as exc:
                failed[child["kind"]] = apply_failure(kind, child["metadata"]["name"], exc)
                metrics.APPLY_ERRORS.labels(kind=child["kind"]).inc()
                self._post(obj, [Event("Warning", EventReason.APPLY_FAILED, failed[child["kind"]])])
        return failed

    def _delete(self, obj: dict[str, Any], deletions: list[Deletion]) -> None:
        """Delete each object (skipped when it is of a watched child kind and the watch saw none);
        post its Event once it is gone. A failed delete is a Warning Event, and the rest of the
        reconcile goes on."""
        namespace = obj["metadata"]["namespace"]
        for d in deletions:
            if self.cache is not None and d.kind in CHILD_KINDS and \
                    self.cache.get(*d.kind.type_meta, namespace, d.name) is None:
                continue  # the watch saw none
            try:
                gone = self.kube.delete(*d.kind.type_meta, namespace, d.name, uid=d.uid)
            except ApiError as exc:
                self._post(obj, [Event("Warning", EventReason.DELETE_FAILED, f"{d.kind.kind} {d.name} not removed: "
                                       f"{exc.status} {exc.reason}: {exc.message}")])
                continue
            if gone and self.cache is not None:  # the DELETED event may come after this reconcile's status
                self.cache.update("DELETED", {"apiVersion": d.kind.api_version, "kind": d.kind.kind,
                                              "metadata": {"name": d.name, "namespace": namespace}})
            if gone and d.event is not None:
                self._post(obj, [d.event])

    def _reprioritize(self, obj: dict[str, Any], changes: list[Reprioritize]) -> None:
        """Merge-patch each Workload's priority and capacity annotation (its UID in the patch: a
        fresh Workload of the same name is left alone); post its Event once written. A failed
        patch is a Warning Event, and the rest of the reconcile goes on."""
        namespace = obj["metadata"]["namespace"]
        for change in changes:
            try:
                self.kube.patch_merge(*WORKLOAD.type_meta, namespace, change.workload, change.patch())
            except ApiError as exc:
                self._post(obj, [Event("Warning", EventReason.PRIORITY_NOT_SET, f"Workload {change.workload}: priority "
                                       f"not set to {change.priority} ({change.capacity}): {exc.status} {exc.reason}: "
                                       f"{exc.message}")])
                continue
            if change.event is not None:
                self._post(obj, [change.event])

    def _ensure_finalizer(self, obj: dict[str, Any]) -> dict[str, Any]:
        finalizers = obj["metadata"].get("finalizers", [])
        if FINALIZER in finalizers:
            return obj
        meta = obj["metadata"]
        return self.kube.patch_merge(*KIMIK3_DEPLOYMENT.type_meta, meta["namespace"], meta["name"], {
            "metadata": {"finalizers": [*finalizers, FINALIZER], "resourceVersion": meta["resourceVersion"]}})

    def _write_status(self, obj: dict[str, Any], status: KimiK3DeploymentStatus) -> None:
        """Merge-patch ``status`` into the CR's status subresource, unless that changes nothing."""
        patch = status_patch(status)
        stored = obj.get("status") or {}
        if merge_patch(stored, patch) == stored:
            return
        meta = obj["metadata"]
        self.kube.patch_merge(*KIMIK3_DEPLOYMENT.type_meta, meta["namespace"], meta["name"], {"status": patch},
                              subresource="status")

    def _readiness_changed(self, obj: dict[str, Any], status: KimiK3DeploymentStatus, desired: int) -> None:
        """Group gauges, and an Event each time Ready flips: Warning ``GroupsNotReady`` (True ->
        False, counted in ``kimik3_ready_lost_total``) or Normal ``GroupsReady`` (False -> True)."""
        meta = obj["metadata"]
        metrics.GROUPS.labels(meta["namespace"], meta["name"], "desired").set(desired)
        metrics.GROUPS.labels(meta["namespace"], meta["name"], "ready").set(status.ready_replicas or 0)
        before = next((c.status for c in stored_conditions(obj) if c.type == ConditionType.READY), None)
        now = status.condition(ConditionType.READY)
        assert now is not None  # compute_status always sets Ready
        if before == "True" and now.status == "False":
            metrics.READY_LOST.labels(meta["namespace"], meta["name"]).inc()
            self._post(obj, [Event("Warning", EventReason.GROUPS_NOT_READY, now.message, once=False)])
        elif before == "False" and now.status == "True":
            self._post(obj, [Event("Normal", EventReason.GROUPS_READY, now.message, once=False)])

    def _placement_changed(self, namespace: str, name: str, groups: list[GroupStatus]) -> None:
        """``kimik3_placement_groups``: the groups of ``status.groups`` counted by (rack, Kueue
        state), an unset field as the empty label; pairs counted before and not now are removed."""
        counts = Counter((g.rack or "", g.kueue or "") for g in groups)
        for rack, kueue in self._placed.get((namespace, name), set()) - set(counts):
            metrics.PLACED_GROUPS.remove(namespace, name, rack, kueue)
        for (rack, kueue), n in counts.items():
            metrics.PLACED_GROUPS.labels(namespace, name, rack, kueue).set(n)
        if counts:
            self._placed[(namespace, name)] = set(counts)
        else:
            self._placed.pop((namespace, name), None)

    # -- delete ------------------------------------------------------------------------------
    def _teardown(self, obj: dict[str, Any]) -> Result:
        meta = obj["metadata"]
        if FINALIZER not in meta.get("finalizers", []):
            return Result("gone", None)
        owner = Owner.from_object(obj)
        ns = owner.namespace
        lwss = self.kube.list(*LEADER_WORKER_SET.type_meta, ns, f"{DEPLOYMENT_LABEL}={owner.name}")
        if lwss:
            for lws in lwss:
                if not is_deleting(lws):
                    self.kube.delete(*LEADER_WORKER_SET.type_meta, ns, lws["metadata"]["name"])
            self._post(obj, [Event("Normal", EventReason.TEARDOWN_STARTED, "deleting the LeaderWorkerSets first; the "
                                   "ComputeDomain goes once their pods are gone")])
            return Result("tearing-down", TEARDOWN_POLL_S)
        pods = self.kube.list(*POD.type_meta, ns, lws_selector(owner))
        if pods:
            pod = pods[0]["metadata"]["name"]
            self._post(obj, [Event("Normal", EventReason.TEARDOWN_WAITING, f"waiting for pod {pod} ({len(pods)} left) to "
                                   "terminate before releasing the ComputeDomain")])
            return Result("tearing-down", TEARDOWN_POLL_S)
        cd = self.kube.get(*COMPUTE_DOMAIN.type_meta, ns, owner.name)
        if cd is not None:
            if not is_deleting(cd):
                self.kube.delete(*COMPUTE_DOMAIN.type_meta, ns, owner.name)
            return Result("tearing-down", TEARDOWN_POLL_S)
        self.kube.patch_merge(*KIMIK3_DEPLOYMENT.type_meta, ns, owner.name, {"metadata": {
            "finalizers": [f for f in meta["finalizers"] if f != FINALIZER],
            "resourceVersion": meta["resourceVersion"]}})
        self._posted.pop((ns, owner.name), None)
        log.info("teardown of %s/%s complete", ns, owner.name)
        return Result("deleted", None)
