"""Level-based reconcile of one KimiK3Deployment: admit, scale, render, apply, prune, status; or tear down.

``Reconciler.reconcile(namespace, name)`` reads the CR and makes the world match it. It is
idempotent and keeps no state between calls apart from which Events it already posted, so a
restarted operator, a lost watch or a deleted child all converge by calling it again. It returns
when to look again (``Result.requeue_after``, seconds). The spec is admitted once per reconcile
(``kimik3.admission.admit``); the autoscaler, the renderer and the status all take that one value.

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
from dataclasses import dataclass
from typing import Any

from kimik3.admission import AdmissionPolicy, Admitted, admit
from kimik3.api.conditions import ConditionType, Reason, Verdict
from kimik3.api.errors import SpecErrors
from kimik3.api.v1alpha1 import KimiK3DeploymentStatus
from kimik3.controller import metrics
from kimik3.controller.autoscaling import Autoscaling
from kimik3.controller.cache import ObjectCache, desired_hash
from kimik3.controller.canary import Analysis
from kimik3.controller.computedomains import (PREPARE_EVENTS, PrepareFailure, compute_domain_verdict, prepare_failures,
                                              unprepared_pods, with_prepare_failures)
from kimik3.controller.kube import ApiError, Kube, NotLeading
from kimik3.controller import launchers
from kimik3.controller.recreation import GroupFailures
from kimik3.controller.fleet import EngineSet, FleetPlan, engine_sets, fleet_replicas
from kimik3.controller.rollout import Rollouts, scale_down_held, step_event
from kimik3.controller.staging import DEFAULT_STAGER_IMAGE, Staging, with_weights
from kimik3.controller.status import (compute_status, invalid_status, lws_selector, merge_patch, status_patch,
                                     stored_conditions)
from kimik3.controller.groups import kueue_changes, stored_groups
from kimik3.controller.nodes import Nodes
from kimik3.controller.readmit import awaits_kueue, readmissions
from kimik3.kube.kinds import (CHILD_NEEDS, COMPUTE_DOMAIN, CONFIG_MAP, EVENT, GROUP, HTTP_ROUTE, KIMIK3_DEPLOYMENT,
                               LEADER_WORKER_SET, POD, POD_MONITOR, SERVED_BY, WORKLOAD, Kind, kind_of)
from kimik3.kube.labels import DEPLOYMENT_LABEL, KUEUE_JOB_UID_LABEL, PRODUCT_LABEL
from kimik3.kube.pods import node_name
from kimik3.kube.workloads import waiting
from kimik3.topology.capacity import Domain, domains, largest_free_block
from kimik3.kube.objects import is_deleting
from kimik3.render.children import COMPUTE_DOMAIN_SKIPPED, render
from kimik3.render.meta import Owner

FINALIZER = f"{GROUP}/teardown"
RESYNC_READY_S = 600.0
"""Safety resync of a settled deployment: watches on every child and pod trigger the reconciles
that matter (drift, deletion, group status) within a second."""
RESYNC_STARTING_S = 120.0
"""Safety resync while groups start (pod and LeaderWorkerSet watches drive status sooner)."""
TEARDOWN_POLL_S = 3.0

REPLACE_POLL_S = 2.0
"""Re-check this often while Kueue may be replacing a group's failed tray (``controller.readmit``), seconds."""
ANNOUNCE_S = 0.0
"""Reconcile again at once after writing WeightsReady=True, before which no engine is applied."""
BOUND_UNFINISHED = "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"
"""Field selector of the pods that hold a node's GPUs (as kube-scheduler counts them)."""
log = logging.getLogger("kimik3.reconcile")


UNSERVED_FIX: dict[Kind, str] = {
    POD_MONITOR: "or set spec.monitoring.enabled: false",
    HTTP_ROUTE: "or remove spec.service.httpRoute",
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


class Reconciler:
    """Reconciles KimiK3Deployments through ``kube``."""

    def __init__(self, kube: Kube, compute_domains: bool = True, cache: ObjectCache | None = None,
                 policy: AdmissionPolicy = AdmissionPolicy(), autoscaling: Autoscaling | None = None,
                 failures: GroupFailures | None = None, stager_image: str = DEFAULT_STAGER_IMAGE):
        self.kube = kube
        self.failures = failures or GroupFailures()
        """Engine failures the pod watch saw (bounded recreation: Degraded and a start back-off)."""
        self.staging = Staging(kube, stager_image)
        """The weights gate: model caches staged before any engine pod (controller/staging.py)."""
        self.policy = policy
        self.autoscaling = autoscaling or Autoscaling()
        """Decode-latency autoscaler state of every deployment with spec.autoscaling.enabled."""
        self.rollouts = Rollouts(Analysis(self.autoscaling.scrape_url))
        """Pause, canary analysis and rollback (``controller.rollout``)."""
        self.cache = cache
        """What the watches saw; without it every read goes to the API server."""
        self.compute_domains = compute_domains
        """False in clusters without NVIDIA's DRA driver: no ComputeDomain or channel claims."""
        self.nodes = Nodes(kube)
        """Node labels (each tray's rack) and node lists (free trays)."""
        self._posted: dict[tuple[str, str], set[str]] = {}

    # -- events ------------------------------------------------------------------------------
    def _event_once(self, obj: dict[str, Any], type_: str, reason: str, message: str) -> None:
        """Post an Event unless the same one was posted for this object already."""
        key = (obj["metadata"]["namespace"], obj["metadata"]["name"])
        seen = self._posted.setdefault(key, set())
        token = f"{obj['metadata'].get('generation')}|{reason}|{message}"
        if token in seen:
            return
        seen.add(token)
        self.kube.event(obj, type_, reason, message)

    # -- reads and writes through the cache --------------------------------------------------
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

    def _get_child(self, kind: Kind, namespace: str, name: str) -> dict[str, Any] | None:
        if self.cache is not None:
            return self.cache.get(*kind.type_meta, namespace, name)
        return self.kube.get(*kind.type_meta, namespace, name)

    def _pods(self, owner: Owner) -> list[dict[str, Any]]:
        if self.cache is not None:
            if self.cache.pods_stale(owner.namespace, owner.name):  # re-listed: pods may have gone meanwhile
                listed, version = self.kube.list_versioned(*POD.type_meta, owner.namespace, lws_selector(owner))
                self.cache.replace_pods(owner.namespace, owner.name, listed, version)
            return self.cache.pods(owner.namespace, owner.name)
        return self.kube.list(*POD.type_meta, owner.namespace, lws_selector(owner))

    def _sets(self, owner: Owner, pods: list[dict[str, Any]], nodes_per_group: int) -> list[EngineSet]:
        """The deployment's LeaderWorkerSets (``controller.fleet``), oldest first."""
        if self.cache is not None:
            lwss = self.cache.owned(*LEADER_WORKER_SET.type_meta, owner.namespace, owner.name)
        else:
            lwss = self.kube.list(*LEADER_WORKER_SET.type_meta, owner.namespace, f"{DEPLOYMENT_LABEL}={owner.name}")
        return engine_sets(lwss, pods, nodes_per_group)

    # -- entry point -------------------------------------------------------------------------
    def reconcile(self, namespace: str, name: str) -> Result:
        start = time.monotonic()
        try:
            # Inside the try: a failed read (API server unreachable) is a reconcile error too.
            obj = self.kube.get(*KIMIK3_DEPLOYMENT.type_meta, namespace, name)
            if obj is None:
                self._posted.pop((namespace, name), None)
                for state in ("desired", "ready"):
                    with contextlib.suppress(KeyError):
                        metrics.GROUPS.remove(namespace, name, state)
                return Result("gone", None)
            if is_deleting(obj):
                result = self._teardown(obj)
            else:
                result = self._apply(obj)
        except NotLeading:  # not an error: the replica that leads reconciles it
            raise
        except Exception:
            metrics.RECONCILES.labels(result="error").inc()
            raise
        metrics.RECONCILES.labels(result=result.outcome).inc()
        metrics.RECONCILE_SECONDS.observe(time.monotonic() - start)
        return result

    # -- create / update / resume ------------------------------------------------------------
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

    def _compute_domain(self, obj: dict[str, Any], objects: list[dict[str, Any]], owner: Owner,
                        pods: list[dict[str, Any]]) -> tuple[Verdict | None, list[PrepareFailure], float | None]:
        """ComputeDomainReady of the deployment's ComputeDomain when it has one (F19), the pods
        the kubelet has failed to prepare past their bound (F19 b), and when to look again."""
        if not any(c["kind"] == COMPUTE_DOMAIN.kind for c in objects):
            return None, [], None
        failures: list[PrepareFailure] = []
        again = None
        if unprepared_pods(pods):
            try:
                events = self.kube.list(*EVENT.type_meta, owner.namespace, "", field_selector=PREPARE_EVENTS)
            except ApiError as exc:
                log.warning("cannot list the %s Events of %s/%s: %s %s", PREPARE_EVENTS, owner.namespace, owner.name,
                            exc.status, exc.reason)
                events = []
            failures, again = prepare_failures(pods, events, dt.datetime.now(dt.timezone.utc))
        verdict = compute_domain_verdict(self._get_child(COMPUTE_DOMAIN, owner.namespace, owner.name), pods, failures)
        if verdict is not None and verdict.status == "False":
            reason = "ComputeDomainPrepareFailed" if failures else "ComputeDomainNodesMissing"
            self._event_once(obj, "Warning", reason, verdict.message)
        return verdict, failures, again

    def _apply(self, obj: dict[str, Any]) -> Result:
        try:
            admitted = admit(obj.get("spec") or {}, self.policy)
        except SpecErrors as exc:
            problems = "; ".join(map(str, exc.errors))
            self._event_once(obj, "Warning", "InvalidSpec", f"spec refused, nothing changed: {problems}")
            self._write_status(obj, invalid_status(obj, problems))
            return Result("invalid", None)
        obj = self._ensure_finalizer(obj)
        owner = Owner.from_object(obj)
        nodes_per_group = admitted.plan.nodes_per_group
        scaled = None
        workloads = None
        seen = self._pods(owner)  # before this reconcile's applies (read again after them)
        sets = self._sets(owner, seen, nodes_per_group)
        if admitted.spec.autoscaling.enabled:
            workloads = self._workloads(admitted, sets)
            scaled = self.autoscaling.step(obj, admitted, sets, seen, workloads)
            progress = next((c.reason for c in stored_conditions(obj) if c.type == ConditionType.PROGRESSING), None)
            keep = scale_down_held(progress, fleet_replicas(sets) or 0, scaled.replicas,
                                   admitted.spec.autoscaling.max_replicas)
            if keep is not None:
                self._event_once(obj, "Normal", "ScaleDownHeld", f"keeping {keep} group(s), not {scaled.replicas}, "
                                 "until the rollout is done")
                scaled.replicas = keep
            for type_, reason, message in scaled.events:
                self._event_once(obj, type_, reason, message)
        else:
            self.autoscaling.forget(owner.namespace, owner.name)
        crash_looping = self.failures.verdict(owner.namespace, owner.name)
        if crash_looping is not None:
            self._event_once(obj, "Warning", crash_looping.reason, crash_looping.message)
        rendered = render(admitted, owner, replicas=None if scaled is None else scaled.replicas,
                          compute_domains=self.compute_domains,
                          start_delay_s=self.failures.start_delay_s(owner.namespace, owner.name))
        index = next(i for i, c in enumerate(rendered.objects) if c["kind"] == LEADER_WORKER_SET.kind)
        desired = int(rendered.objects[index]["spec"]["replicas"])
        rolled = self.rollouts.step(obj, admitted, rendered.objects[index], sets, seen)
        rendered.objects[index:index + 1] = rolled.fleet.apply
        for type_, reason, message in rolled.events:
            self._event_once(obj, type_, reason, message)
        for warning in rendered.warnings:
            reason = "ComputeDomainSkipped" if warning == COMPUTE_DOMAIN_SKIPPED else "DisruptionBudgetSkipped"
            self._event_once(obj, "Warning", reason, warning)
        weights = self.staging.step(obj, admitted)
        # No GPU before the weights; and once staged, WeightsReady=True is written one reconcile
        # before the first engine pod, so no reader ever sees a pod while the status says Staging.
        announcing = weights.ready and any(c.type == ConditionType.WEIGHTS_READY and c.status == "False"
                                           for c in stored_conditions(obj))
        held = () if weights.ready and not announcing else (LEADER_WORKER_SET.kind, COMPUTE_DOMAIN.kind)
        failed: dict[str, str] = {}
        for child in rendered.objects:
            if child["kind"] in held:
                continue
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
                self._event_once(obj, "Warning", "ApplyFailed", failed[child["kind"]])
        apply_error = "; ".join(failed.values()) or None
        if LEADER_WORKER_SET.kind not in failed and LEADER_WORKER_SET.kind not in held:
            self._retire(obj, rolled.fleet, desired)
        pods = self._pods(owner)
        for kind in rendered.absent:
            if kind == COMPUTE_DOMAIN and pods:
                continue  # F4: pods still hold its channel claim; deleted once they are gone
            if self.cache is not None and self.cache.get(*kind.type_meta, owner.namespace, owner.name) is None:
                continue  # the watch saw none
            if self.kube.delete(*kind.type_meta, owner.namespace, owner.name):
                self._event_once(obj, "Normal", "Deleted", f"{kind.kind} {owner.name} removed: not needed by the spec")
        listed_for = {s.lws["metadata"].get("uid") for s in sets}
        sets = self._sets(owner, pods, nodes_per_group)
        target = next((s for s in sets if s.name == rolled.fleet.target and not s.deleting), None)
        if workloads is None or {s.lws["metadata"].get("uid") for s in sets} != listed_for:
            workloads = self._workloads(admitted, sets)  # listed once per reconcile unless a set is new
        racks = self.nodes.domains_of(map(node_name, pods), admitted.spec.scheduling.topology_key)
        readmitting = self._readmit_groups(obj, owner, workloads, pods, racks, sets)
        domain, unprepared, prepare_again = self._compute_domain(obj, rendered.objects, owner, pods)
        status = compute_status(obj, admitted, sets, target, pods, desired, apply_error, rollout_step=rolled,
                                compute_domain_note=None if self.compute_domains else COMPUTE_DOMAIN_SKIPPED,
                                autoscaled=scaled.report if scaled is not None else None,
                                workloads=workloads, crash_looping=crash_looping,
                                compute_domain=domain,
                                free_block=self._free_block(admitted, workloads), racks=racks)
        status = with_weights(status, weights, obj["metadata"].get("generation"), bool(sets))
        status.groups = with_prepare_failures(status.groups or [], unprepared)
        if not apply_error:
            self._prune_launchers(obj, owner, rendered.objects, sets, pods)
        for type_, reason, message in kueue_changes(stored_groups(obj), status.groups or []):
            self.kube.event(obj, type_, reason, message)
        if (obj.get("status") or {}).get("observedGeneration") != obj["metadata"].get("generation") and not apply_error:
            kinds = ", ".join(c["kind"] for c in rendered.objects)
            self._event_once(obj, "Normal", "Applied",
                             f"generation {obj['metadata'].get('generation')}: applied {kinds}; "
                             f"{desired} group(s) of {admitted.plan.nodes_per_group} pods x "
                             f"{admitted.plan.gpus_per_node} GPUs")
        step = step_event(status, admitted, desired)
        if step is not None:
            self._event_once(obj, "Normal", *step)
        limited = status.condition(ConditionType.SCALING_LIMITED)
        if limited and limited.status == "True" and limited.reason != Reason.ALL_GROUPS_PLACED:
            self._event_once(obj, "Warning", limited.reason, limited.message)
        self._write_status(obj, status)
        ready = self._readiness_changed(obj, status, desired)
        if apply_error:
            log.warning("reconcile of %s/%s: %s; retrying with back-off", owner.namespace, owner.name,
                        apply_error[:300])
            return Result("apply-failed", None, retry=True)
        requeue = REPLACE_POLL_S if readmitting else RESYNC_READY_S if ready else RESYNC_STARTING_S
        requeue = min(requeue, rolled.requeue_after or requeue, weights.requeue_after or requeue,
                      prepare_again or requeue, ANNOUNCE_S if announcing else requeue)
        return Result("applied", min(requeue, scaled.requeue_after) if scaled is not None else requeue)

    def _prune_launchers(self, obj: dict[str, Any], owner: Owner, objects: list[dict[str, Any]],
                         sets: list[EngineSet], pods: list[dict[str, Any]]) -> None:
        """Delete the launcher ConfigMaps no revision with groups needs, once the rollout settled
        (``controller.launchers``)."""
        if not launchers.settled(sets):
            return
        rendered = next(c["metadata"]["name"] for c in objects if c["kind"] == CONFIG_MAP.kind)
        keep = launchers.in_use(rendered, sets, pods)
        listed = self.cache.owned(*CONFIG_MAP.type_meta, owner.namespace, owner.name) if self.cache is not None \
            else self.kube.list(*CONFIG_MAP.type_meta, owner.namespace, f"{DEPLOYMENT_LABEL}={owner.name}")
        for name in launchers.stale(owner, listed, keep):
            if self.kube.delete(*CONFIG_MAP.type_meta, owner.namespace, name):
                self._event_once(obj, "Normal", "Deleted", f"ConfigMap {name} removed: no group runs a revision "
                                 f"that mounts it (kept: {', '.join(sorted(keep))})")

    def _retire(self, obj: dict[str, Any], fleet: FleetPlan, desired: int) -> None:
        """Delete the LeaderWorkerSets the rollout is done with (``controller.fleet``); once the
        last old one goes, a ``RolloutComplete`` Event."""
        meta = obj["metadata"]
        gone = []
        for name in fleet.delete:
            try:
                if self.kube.delete(*LEADER_WORKER_SET.type_meta, meta["namespace"], name):
                    gone.append(name)
            except ApiError as exc:  # e.g. no delete permission: said, and the rest of the reconcile goes on
                self._event_once(obj, "Warning", "DeleteFailed", f"LeaderWorkerSet {name} not removed: "
                                 f"{exc.status} {exc.reason}: {exc.message}")
        if self.cache is not None:  # the DELETED event may come after this reconcile's status
            for name in gone:
                self.cache.update("DELETED", {"apiVersion": LEADER_WORKER_SET.api_version, "kind": LEADER_WORKER_SET.kind,
                                              "metadata": {"name": name, "namespace": meta["namespace"]}})
        for name in gone:
            self._event_once(obj, "Normal", "Deleted", f"LeaderWorkerSet {name} removed: "
                             + (f"its groups are replaced by {fleet.target}'s" if fleet.target else "not needed"))
        if gone and fleet.complete:
            self._event_once(obj, "Normal", "RolloutComplete", f"every group runs on LeaderWorkerSet {fleet.target} "
                             f"({desired} group(s) Ready); {', '.join(gone)} removed")

    def _workloads(self, admitted: Admitted, sets: list[EngineSet]) -> list[dict[str, Any]] | None:
        """Under placement ``kueue``, the Workloads Kueue made for the groups of the deployment's
        LeaderWorkerSets (label ``kueue.x-k8s.io/job-uid``); None otherwise, or before one exists."""
        uids = sorted(u for s in sets if (u := s.lws["metadata"].get("uid")))
        if admitted.spec.scheduling.placement.mode != "kueue" or not uids:
            return None
        namespace = sets[0].lws["metadata"]["namespace"]
        try:
            return self.kube.list(*WORKLOAD.type_meta, namespace, f"{KUEUE_JOB_UID_LABEL} in ({','.join(uids)})")
        except ApiError as exc:
            log.warning("cannot list Kueue Workloads in %s (%s %s): is Kueue installed?", namespace,
                        exc.status, exc.reason)
            return None

    def _readmit_groups(self, obj: dict[str, Any], owner: Owner, workloads: list[dict[str, Any]] | None,
                        pods: list[dict[str, Any]], racks: dict[str, str], sets: list[EngineSet]) -> bool:
        """Placement kueue: delete the Workload of each group Kueue split across racks or whose tray
        failed, for Kueue to admit the group again whole (``controller.readmit``). Returns whether
        to look again soon: a Workload was deleted, or an admitted group has a pod not yet on a
        tray (Workloads are not watched: the reconcile then comes back in ``REPLACE_POLL_S``)."""
        names = {s.lws["metadata"].get("uid", ""): s.name for s in sets}
        steps = readmissions(workloads or [], pods, racks, names)
        for step in steps:
            try:
                self.kube.delete(*WORKLOAD.type_meta, owner.namespace, step.workload, uid=step.uid)
            except ApiError as exc:
                log.warning("cannot delete Workload %s/%s to re-admit its group (%s %s)", owner.namespace,
                            step.workload, exc.status, exc.reason)
                continue
            self.kube.event(obj, *step.event)
        return bool(steps) or awaits_kueue(workloads or [], pods, names)

    def _free_block(self, admitted: Admitted, workloads: list[dict[str, Any]] | None) -> Domain | None:
        """When Kueue says no rack fits a group: the NVLink domain with the most free trays for one
        of its pods (``topology.capacity``, from every node of the spec's GPU product and the pods
        bound to them, all namespaces). None otherwise, and when the operator may not list nodes
        (a namespace-scoped install): the condition then quotes Kueue alone."""
        if not any(w is not None and w.why == "topology" for w in map(waiting, workloads or [])):
            return None
        plan = admitted.plan
        nodes = self.nodes.listed()
        if nodes is None:
            return None
        try:
            pods = self.kube.list(*POD.type_meta, "", "", field_selector=BOUND_UNFINISHED)
        except ApiError as exc:
            log.info("largest free block of trays unknown: cannot list pods (%s %s)", exc.status, exc.reason)
            return None
        return largest_free_block(domains(nodes, pods, admitted.spec.scheduling.topology_key, plan.gpus_per_node,
                                          {PRODUCT_LABEL: plan.profile.product_label}))

    def _readiness_changed(self, obj: dict[str, Any], status: KimiK3DeploymentStatus, desired: int) -> bool:
        """Group gauges, and an Event each time Ready flips: Warning ``GroupsNotReady`` (True ->
        False, counted in ``kimik3_ready_lost_total``) or Normal ``GroupsReady`` (False -> True).
        Returns whether the deployment is Ready now."""
        meta = obj["metadata"]
        metrics.GROUPS.labels(meta["namespace"], meta["name"], "desired").set(desired)
        metrics.GROUPS.labels(meta["namespace"], meta["name"], "ready").set(status.ready_replicas or 0)
        before = next((c.status for c in stored_conditions(obj) if c.type == ConditionType.READY), None)
        now = status.condition(ConditionType.READY)
        assert now is not None  # compute_status always sets Ready
        if before == "True" and now.status == "False":
            metrics.READY_LOST.labels(meta["namespace"], meta["name"]).inc()
            self.kube.event(obj, "Warning", "GroupsNotReady", now.message)
        elif before == "False" and now.status == "True":
            self.kube.event(obj, "Normal", "GroupsReady", now.message)
        return now.status == "True"

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
            self._event_once(obj, "Normal", "TeardownStarted", "deleting the LeaderWorkerSets first; the "
                             "ComputeDomain goes once their pods are gone")
            return Result("tearing-down", TEARDOWN_POLL_S)
        pods = self.kube.list(*POD.type_meta, ns, lws_selector(owner))
        if pods:
            pod = pods[0]["metadata"]["name"]
            self._event_once(obj, "Normal", "TeardownWaiting",
                             f"waiting for pod {pod} ({len(pods)} left) to terminate before releasing the ComputeDomain")
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
