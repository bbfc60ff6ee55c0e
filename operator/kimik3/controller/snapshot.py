"""One reconcile's view of the cluster: the CR and everything it owns or waits on, read once.

A ``Snapshot`` holds what one reconcile of a KimiK3Deployment reads: its pods, its
LeaderWorkerSets (``controller.fleet.EngineSet``), under placement ``kueue`` the Workloads Kueue
made for its groups, the NVLink domain (rack) of every tray its pods are bound to, its
ComputeDomain and its launcher ConfigMaps; with ``spec.routing`` whether the InferencePool kind is
served, the pool and the endpoint picker's Deployment; with ``spec.service.httpRoute`` the Gateways
the route names; and the facts derived from them once: each engine group (``Group``:
LeaderWorkerSet, index, pods, revision, readiness, the rack of every pod, trays). Every step of the
reconcile (``controller.steps``) reads the snapshot; none lists the API server itself.

``Reader.take`` reads it before the applies; ``Reader.refresh`` reads again, after them, only
what the applies can have changed: the pods, their trays' racks and the LeaderWorkerSets (and the
Workloads when a LeaderWorkerSet was created or deleted), plus what the status needs only in some
states (the kubelet's prepare Events while a pod waits on its node, the free trays while Kueue
finds no rack), and every KimiK3Deployment (``controller.placementmix`` compares their placement
modes). Reads go through the watch cache where a watch keeps one (``controller.cache``), else to
the API server; ``Reader.reads`` counts both, per kind and phase (tests/test_reconcile_reads.py).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from kimik3.admission import Admitted
from kimik3.controller.cache import ObjectCache
from kimik3.controller.capacity import Priorities, reserved_groups
from kimik3.controller.computedomains import PREPARE_EVENTS, SLICES_OF_DRIVER, unprepared_pods
from kimik3.controller.fleet import EngineSet, engine_sets
from kimik3.controller.kube import ApiError, Forbidden, Kube
from kimik3.controller.lateapis import served
from kimik3.controller.nodes import Nodes
from kimik3.controller.queues import QueueRead, kueue_marked
from kimik3.controller.routing import GatewayRead
from kimik3.kube import pods as kpods
from kimik3.kube.groups import Group, GroupKey, groups_of
from kimik3.kube.kinds import (COMPUTE_DOMAIN, CONFIG_MAP, DEPLOYMENT, EVENT, GATEWAY, INFERENCE_OBJECTIVE, INFERENCE_POOL,
                               KIMIK3_DEPLOYMENT, LEADER_WORKER_SET, LOCAL_QUEUE, NODE, POD, RESOURCE_SLICE, WORKLOAD,
                               WORKLOAD_PRIORITY_CLASS, Kind)
from kimik3.kube.labels import DEPLOYMENT_LABEL, KUEUE_JOB_UID_LABEL, LWS_NAME_LABEL, PRODUCT_LABEL
from kimik3.kube.objects import condition
from kimik3.kube.workloads import waiting
from kimik3.render.meta import Owner
from kimik3.render.routing import picker_name
from kimik3.topology.capacity import Domain, domains, largest_free_block

BOUND_UNFINISHED = "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"
"""Field selector of the pods that hold a node's GPUs (as kube-scheduler counts them)."""
log = logging.getLogger("kimik3.snapshot")


@dataclass(frozen=True)
class Snapshot:
    """What one reconcile of the CR ``obj`` read (see the module)."""

    obj: dict[str, Any]
    owner: Owner
    pods: list[dict[str, Any]]
    """Every pod of the deployment's LeaderWorkerSets."""
    groups: dict[GroupKey, Group]
    sets: list[EngineSet]
    """The deployment's LeaderWorkerSets, oldest first (``controller.fleet.engine_sets``)."""
    workloads: list[dict[str, Any]] | None
    """Placement kueue: the Workloads of the sets' groups (label ``kueue.x-k8s.io/job-uid``); None
    otherwise, before a set exists, or when Kueue's API cannot be read."""
    racks: dict[str, str]
    """NVLink domain (the spec's topology key's label) of each node a pod is bound to."""
    compute_domain: dict[str, Any] | None = None
    launchers: list[dict[str, Any]] = field(default_factory=list)
    """The deployment's ConfigMaps (launcher scripts of every revision)."""
    prepare_events: list[dict[str, Any]] = field(default_factory=list)
    """After the applies, while a pod waits on its node: the kubelet's ``FailedPrepareDynamicResources``
    Events of the namespace (``controller.computedomains``)."""
    free_block: Domain | None = None
    """After the applies, while Kueue finds no rack for a group: the NVLink domain with the most
    free trays for one of its pods (None when the nodes cannot be listed)."""
    sliced: set[str] | None = None
    """After the applies, with a ComputeDomain and pods on nodes: the nodes with a ResourceSlice of
    the ComputeDomain driver (None: not read, or not readable)."""
    pools_served: bool = True
    """Whether the API server serves InferencePool (read before the applies with ``spec.routing``
    only: the render falls back to the Service path without it)."""
    pool: dict[str, Any] | None = None
    """After the applies, with ``spec.routing``: the deployment's InferencePool."""
    picker: dict[str, Any] | None = None
    """After the applies, with ``spec.routing``: the endpoint picker's Deployment."""
    gateways: list[GatewayRead] = field(default_factory=list)
    """After the applies, with ``spec.service.httpRoute``: each Gateway the route names, as read."""
    objectives_served: bool = True
    """After the applies, while the picker has no available replica: whether the API server serves
    InferenceObjective (the picker exits at start without it); True when not asked."""
    deployments: list[dict[str, Any]] | None = None
    """After the applies: every KimiK3Deployment the operator sees, this one included (for
    ``controller.placementmix``; None: not readable)."""
    priorities: Priorities | str | None = None
    """After the applies, with ``placement.burstPriorityClass`` and Workloads: the values of the
    reserved and burst WorkloadPriorityClasses, or why they cannot be read (``controller.capacity``)."""

    @property
    def set_uids(self) -> dict[str, str]:
        """LeaderWorkerSet uid -> name (a Workload names its set's uid)."""
        return {s.lws["metadata"].get("uid", ""): s.name for s in self.sets}


def domains_of_groups(admitted: Admitted, racks: dict[str, str]) -> dict[str, str] | None:
    """The trays' racks a group is judged by (``kube.groups.Group.racks``, ``split``): those of a
    plan whose groups must each sit in one NVLink domain (``plan.clique_placement``: multi-tray
    NVL72 groups); None for the others (single-node groups; multi-node groups over InfiniBand,
    e.g. H200 TP16 over two nodes, which the topology key does not bound)."""
    return racks if admitted.plan.clique_placement else None


Phase = str
"""``before`` the applies or ``after`` them."""


class Reader:
    """The reads of one reconcile, through the watch ``cache`` when there is one, else ``kube``;
    ``reads`` counts them by (phase, kind), cache and API server alike."""

    def __init__(self, kube: Kube, cache: ObjectCache | None, nodes: Nodes, compute_domains: bool):
        self.kube = kube
        self.cache = cache
        self.nodes = nodes
        self.compute_domains = compute_domains
        self.reads: Counter[tuple[Phase, str]] = Counter()
        self.phase: Phase = "before"

    def _count(self, kind: Kind) -> None:
        self.reads[(self.phase, kind.kind)] += 1

    def pods(self, owner: Owner) -> list[dict[str, Any]]:
        self._count(POD)
        selector = f"{DEPLOYMENT_LABEL}={owner.name},{LWS_NAME_LABEL}"
        if self.cache is None:
            return self.kube.list(*POD.type_meta, owner.namespace, selector)
        if self.cache.pods_stale(owner.namespace, owner.name):  # re-listed: pods may have gone meanwhile
            listed, version = self.kube.list_versioned(*POD.type_meta, owner.namespace, selector)
            self.cache.replace_pods(owner.namespace, owner.name, listed, version)
        return self.cache.pods(owner.namespace, owner.name)

    def owned(self, kind: Kind, owner: Owner) -> list[dict[str, Any]]:
        """The objects of ``kind`` labelled as ``owner``'s children."""
        self._count(kind)
        if self.cache is not None:
            return self.cache.owned(*kind.type_meta, owner.namespace, owner.name)
        return self.kube.list(*kind.type_meta, owner.namespace, f"{DEPLOYMENT_LABEL}={owner.name}")

    def child(self, kind: Kind, owner: Owner) -> dict[str, Any] | None:
        """``owner``'s child of ``kind`` named like it (None when there is none)."""
        return self.named(kind, owner, owner.name)

    def named(self, kind: Kind, owner: Owner, name: str) -> dict[str, Any] | None:
        """``owner``'s child of ``kind`` named ``name`` (None when there is none)."""
        self._count(kind)
        if self.cache is not None:
            return self.cache.get(*kind.type_meta, owner.namespace, name)
        return self.kube.get(*kind.type_meta, owner.namespace, name)

    def workloads(self, admitted: Admitted, sets: list[EngineSet]) -> list[dict[str, Any]] | None:
        """Under placement ``kueue``, the Workloads Kueue made for the groups of ``sets``; None
        otherwise, before a set exists, or when they cannot be listed (said in the log)."""
        uids = sorted(u for s in sets if (u := s.lws["metadata"].get("uid")))
        if admitted.spec.scheduling.placement.mode != "kueue" or not uids:
            return None
        namespace = sets[0].lws["metadata"]["namespace"]
        self._count(WORKLOAD)
        try:
            return self.kube.list(*WORKLOAD.type_meta, namespace, f"{KUEUE_JOB_UID_LABEL} in ({','.join(uids)})")
        except ApiError as exc:
            log.warning("cannot list Kueue Workloads in %s (%s %s): is Kueue installed?", namespace,
                        exc.status, exc.reason)
            return None

    def local_queue(self, admitted: Admitted, owner: Owner, lws: dict[str, Any]) -> QueueRead:
        """The LocalQueue ``queueName`` of ``owner``'s namespace (placement ``kueue``), read from the
        API server (not watched): whether Kueue's API is served, the read refused, or the object;
        once Kueue reports it active, whether a dry run of ``lws`` (the LeaderWorkerSet about to
        create groups) comes back with Kueue's mark (``controller.queues``). Any other error of the
        read is raised; a refused dry run leaves ``marked`` None."""
        name = admitted.spec.scheduling.placement.queue_name or ""
        self._count(LOCAL_QUEUE)
        try:
            obj = self.kube.request("GET", LOCAL_QUEUE.path(owner.namespace, name))
        except Forbidden as exc:
            return QueueRead(name, owner.namespace, refused=f"{exc.status} {exc.reason}: {exc.message}")
        except ApiError as exc:
            if exc.status != 404:
                raise
            return QueueRead(name, owner.namespace, served=exc.is_status)
        if (condition(obj, "Active") or {}).get("status") != "True":
            return QueueRead(name, owner.namespace, obj)
        self._count(LEADER_WORKER_SET)
        try:
            return QueueRead(name, owner.namespace, obj, marked=kueue_marked(self.kube.apply(lws, dry_run=True)))
        except ApiError as exc:
            log.info("dry run of LeaderWorkerSet %s/%s refused (%s %s): the apply will say why", owner.namespace,
                     lws["metadata"]["name"], exc.status, exc.reason)
            return QueueRead(name, owner.namespace, obj)

    def racks(self, pods: Iterable[dict[str, Any]], topology_key: str) -> dict[str, str]:
        names = [kpods.node_name(p) for p in pods]
        self._count(NODE)
        return self.nodes.domains_of(names, topology_key)

    def take(self, obj: dict[str, Any], admitted: Admitted) -> Snapshot:
        """The snapshot before the applies (the racks of the pods' trays, so that a group split
        across racks is not counted Ready by the rollout; no ComputeDomain or prepare Events: the
        steps before the applies need none)."""
        owner = Owner.from_object(obj)
        pods = self.pods(owner)
        racks = self.racks(pods, admitted.spec.scheduling.topology_key)
        sets = engine_sets(self.owned(LEADER_WORKER_SET, owner),
                           groups := groups_of(pods, admitted.plan.nodes_per_group, domains_of_groups(admitted, racks)))
        return Snapshot(obj, owner, pods, groups, sets, self.workloads(admitted, sets), racks,
                        launchers=self.owned(CONFIG_MAP, owner), pools_served=self.pools_served(admitted))

    def pools_served(self, admitted: Admitted) -> bool:
        """With ``spec.routing``, whether discovery lists InferencePool (True without routing: not asked;
        True when discovery cannot be read, so the apply says what is wrong)."""
        return self.served(INFERENCE_POOL) if admitted.spec.routing.enabled else True

    def served(self, kind: Kind) -> bool:
        """Whether discovery lists ``kind`` (True when discovery cannot be read: said in the log)."""
        self._count(kind)
        try:
            return served(self.kube, kind)
        except ApiError as exc:
            log.warning("discovery of %s: %s %s", kind.api_version, exc.status, exc.reason)
            return True

    def gateways(self, admitted: Admitted, owner: Owner) -> list[GatewayRead]:
        """Each Gateway ``spec.service.httpRoute`` names, read from the API server (Gateways are not
        watched); a refused read is kept as such."""
        route = admitted.spec.service.http_route
        out = []
        for ref in route.parent_refs if route is not None else []:
            namespace = ref.namespace or owner.namespace
            self._count(GATEWAY)
            try:
                out.append(GatewayRead(ref, namespace, self.kube.get(*GATEWAY.type_meta, namespace, ref.name)))
            except ApiError as exc:
                out.append(GatewayRead(ref, namespace, refused=f"{exc.status} {exc.reason}: {exc.message}"))
        return out

    def refresh(self, snap: Snapshot, admitted: Admitted, compute_domain: bool) -> Snapshot:
        """``snap`` after the applies: the pods and LeaderWorkerSets read again, the Workloads only
        when the sets are not the ones they were listed for, the racks of the pods' trays; the
        ComputeDomain when the deployment has one (``compute_domain``), with the kubelet's prepare
        Events while a pod waits on its node; the free trays while Kueue finds no rack."""
        self.phase = "after"
        owner, plan = snap.owner, admitted.plan
        pods = self.pods(owner)
        racks = self.racks(pods, admitted.spec.scheduling.topology_key)
        sets = engine_sets(self.owned(LEADER_WORKER_SET, owner),
                           groups := groups_of(pods, plan.nodes_per_group, domains_of_groups(admitted, racks)))
        workloads = snap.workloads
        if {s.lws["metadata"].get("uid", "") for s in sets} != set(snap.set_uids):
            workloads = self.workloads(admitted, sets)
        cd = self.child(COMPUTE_DOMAIN, owner) if compute_domain else None
        events: list[dict[str, Any]] = []
        if compute_domain and unprepared_pods(pods):
            self._count(EVENT)
            try:
                events = self.kube.list(*EVENT.type_meta, owner.namespace, "", field_selector=PREPARE_EVENTS)
            except ApiError as exc:
                log.warning("cannot list the %s Events of %s/%s: %s %s", PREPARE_EVENTS, owner.namespace,
                            owner.name, exc.status, exc.reason)
        routed = admitted.spec.routing.enabled and snap.pools_served
        picker = self.named(DEPLOYMENT, owner, picker_name(owner)) if routed else None
        waiting = routed and not int(((picker or {}).get("status") or {}).get("availableReplicas") or 0)
        return Snapshot(snap.obj, owner, pods, groups, sets, workloads, racks, cd, snap.launchers, events,
                        self.free_block(admitted, workloads),
                        self.sliced() if cd is not None and any(kpods.node_name(p) for p in pods) else None,
                        deployments=self.deployments(), pools_served=snap.pools_served,
                        pool=self.child(INFERENCE_POOL, owner) if routed else None, picker=picker,
                        gateways=self.gateways(admitted, owner),
                        objectives_served=self.served(INFERENCE_OBJECTIVE) if waiting else True,
                        priorities=self.priorities(admitted, workloads))

    def priorities(self, admitted: Admitted, workloads: list[dict[str, Any]] | None) -> Priorities | str | None:
        """With ``placement.burstPriorityClass`` and Workloads to set: the two WorkloadPriorityClasses'
        values, or why they cannot be read (not found, or refused: a namespaced install lacks the
        cluster-wide read); None otherwise."""
        placement = admitted.spec.scheduling.placement
        if reserved_groups(admitted.spec) is None or not workloads:
            return None
        values: list[int] = []
        for name in (placement.priority_class, placement.burst_priority_class):
            self._count(WORKLOAD_PRIORITY_CLASS)
            try:
                found = self.kube.get(*WORKLOAD_PRIORITY_CLASS.type_meta, "", name or "")
            except ApiError as exc:
                return f"WorkloadPriorityClass {name} cannot be read: {exc.status} {exc.reason}"
            if found is None or not isinstance(found.get("value"), int):
                return f"WorkloadPriorityClass {name} not found (kubectl get workloadpriorityclasses)"
            values.append(found["value"])
        return Priorities(*values)

    def deployments(self) -> list[dict[str, Any]] | None:
        """Every KimiK3Deployment the operator sees: through the watch cache (the namespaces it
        watches), else listed in all namespaces; None when the list is refused (logged)."""
        self._count(KIMIK3_DEPLOYMENT)
        if self.cache is not None:
            return self.cache.of_kind(*KIMIK3_DEPLOYMENT.type_meta)
        try:
            return self.kube.list(*KIMIK3_DEPLOYMENT.type_meta, "", "")
        except ApiError as exc:
            log.info("cannot list KimiK3Deployments (%s %s): placement modes not compared", exc.status, exc.reason)
            return None

    def sliced(self) -> set[str] | None:
        """The nodes with a ResourceSlice of the ComputeDomain driver; None when they cannot be
        listed (a namespace-scoped install: the verdict then goes without)."""
        self._count(RESOURCE_SLICE)
        try:
            slices = self.kube.list(*RESOURCE_SLICE.type_meta, "", "", field_selector=SLICES_OF_DRIVER)
        except ApiError as exc:
            log.info("ResourceSlices of the ComputeDomain driver unknown: %s %s", exc.status, exc.reason)
            return None
        return {n for s in slices if (n := (s.get("spec") or {}).get("nodeName"))}

    def free_block(self, admitted: Admitted, workloads: list[dict[str, Any]] | None) -> Domain | None:
        """When Kueue says no rack fits a group: the NVLink domain with the most free trays for one
        of its pods (``topology.capacity``, from every node of the spec's GPU product and the pods
        bound to them, all namespaces). None otherwise, and when the operator may not list nodes
        (a namespace-scoped install): the condition then quotes Kueue alone."""
        if not any(w is not None and w.why == "topology" for w in map(waiting, workloads or [])):
            return None
        plan = admitted.plan
        self._count(NODE)
        nodes = self.nodes.listed()
        if nodes is None:
            return None
        try:
            bound = self.kube.list(*POD.type_meta, "", "", field_selector=BOUND_UNFINISHED)
        except ApiError as exc:
            log.info("largest free block of trays unknown: cannot list pods (%s %s)", exc.status, exc.reason)
            return None
        return largest_free_block(domains(nodes, bound, admitted.spec.scheduling.topology_key, plan.gpus_per_node,
                                          {PRODUCT_LABEL: plan.profile.product_label}))
