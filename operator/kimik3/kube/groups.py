"""Engine groups as their pods show them: a LeaderWorkerSet group is the pods that share its
``leaderworkerset.sigs.k8s.io/name`` and ``group-index`` labels (LeaderWorkerSet v0.9).

``groups_of(pods, nodes_per_group, racks)`` derives each group once (``Group``); the reconcile's
snapshot (``controller.snapshot``) holds the result, and the rollout, the status and the
autoscaler read it instead of grouping pods again. Pure functions over plain dicts.

A group's NVLink domains (``Group.racks``) are the racks of *every* live pod bound to a tray
(``racks``: node name -> the spec's topology key label, read by ``controller.nodes``), not the
first pod's: a multi-node engine spans one NVLink domain or none, so a group whose pods sit in two
racks (``Group.split``) cannot serve as one engine, whatever placed it (Kueue's tray replacement,
kueue#6957; a LeaderWorkerSet whose pod webhook did not inject its exclusive-topology affinity;
a tray relabelled after binding). Such a group is never ``serving`` nor ``live_ready``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from kimik3.kube import pods as kpods
from kimik3.kube.labels import LWS_REVISION_LABEL

GroupKey = tuple[str, int]
"""(LeaderWorkerSet name, group index): one engine group (a rollout runs two LeaderWorkerSets,
each with a group 0)."""


@dataclass(frozen=True)
class Group:
    """One engine group."""

    leader_worker_set: str
    index: int
    pods: tuple[dict[str, Any], ...]
    """Every pod of the group (terminating ones too), by worker index: the leader first."""
    ready: bool
    """At least ``nodes_per_group`` pods, every one Ready (``kube.pods.is_ready``: a terminating
    pod is not)."""
    live: tuple[dict[str, Any], ...]
    """The pods not terminating; a group with none is gone (a retired LeaderWorkerSet's)."""
    live_ready: bool
    """At least ``nodes_per_group`` live pods, every one Ready, inside one NVLink domain (not
    ``split``): the rollout's view of the group."""
    revision: str | None
    """The live leader's ``leaderworkerset.sigs.k8s.io/template-revision-hash`` (None before it exists)."""
    racks: tuple[str, ...] = ()
    """The NVLink domains (values of the topology key's node label) of its live pods bound to a
    tray whose label is known, each once, in worker order (the leader's first); () before any is
    bound, when the nodes cannot be read, and for groups no NVLink domain bounds
    (``controller.snapshot.domains_of_groups``)."""

    @property
    def split(self) -> bool:
        """Its pods sit in more than one NVLink domain: it cannot run as one engine."""
        return len(self.racks) > 1

    @property
    def serving(self) -> bool:
        """Ready (``ready``: as the LeaderWorkerSet counts it) and inside one NVLink domain."""
        return self.ready and not self.split

    @property
    def key(self) -> GroupKey:
        return self.leader_worker_set, self.index

    @property
    def trays(self) -> list[str]:
        """The nodes its pods are bound to, by worker index."""
        return [n for n in map(kpods.node_name, self.pods) if n]


def groups_of(pods: Iterable[dict[str, Any]], nodes_per_group: int,
              racks: Mapping[str, str] | None = None) -> dict[GroupKey, Group]:
    """The groups ``pods`` belong to (``kube.pods.by_group``; pods of no group left out), sorted by
    key; ``racks``: node name -> NVLink domain of the trays known (None: none known, every
    ``Group.racks`` is ())."""
    racks = racks or {}
    out = {}
    for key, members in sorted(kpods.by_group(list(pods)).items()):
        members = sorted(members, key=lambda p: kpods.worker_index(p) or 0)
        live = [p for p in members if not kpods.is_terminating(p)]
        leader = next((p for p in live if kpods.is_leader(p)), None)
        domains = tuple(dict.fromkeys(racks[n] for n in map(kpods.node_name, live) if n in racks))
        live_ready = len(live) >= nodes_per_group and all(map(kpods.is_ready, live)) and len(domains) < 2
        out[key] = Group(key[0], key[1], tuple(members),
                         len(members) >= nodes_per_group and all(map(kpods.is_ready, members)),
                         tuple(live), live_ready,
                         kpods.labels(leader).get(LWS_REVISION_LABEL) if leader is not None else None, domains)
    return out


HELD, SERVING = "held", "serving"
"""States of ``gpus_by_revision``."""
RESERVED: Literal["reserved"] = "reserved"
BURST: Literal["burst"] = "burst"
"""Capacities of ``gpus_by_revision``: a reserved group (up to autoscaling.minReplicas, never
preempted for another tenant's burst) or a burst one (``controller.capacity``)."""


def gpus_by_revision(groups: Iterable[Group], capacity: Callable[[int], str]) -> dict[tuple[str, str, str], int]:
    """(revision, state, capacity) -> GPUs (``kube.pods.gpu_request``) of the groups' pods: ``HELD`` by each
    pod bound to a node and not finished (``kube.pods.holds_node``: from binding to deletion,
    loading and terminating included; a pod waiting for a node holds none), ``SERVING`` by those
    of a Ready group (``Group.ready``). The revision is each pod's own
    ``leaderworkerset.sigs.k8s.io/template-revision-hash`` ("" when missing); the capacity is
    ``capacity(group index)`` (``controller.capacity``: reserved or burst). Each (revision,
    capacity) is there with 0 for both states from its first pod on, bound or not: a counter
    integrating these (``controller.metrics.GpuTime``) is then scraped at zero before it grows,
    and Prometheus' ``increase()`` counts its first GPU-seconds too."""
    out: dict[tuple[str, str, str], int] = {}
    for group in groups:
        kind = capacity(group.index)
        for pod in group.pods:
            revision = kpods.labels(pod).get(LWS_REVISION_LABEL, "")
            gpus = kpods.gpu_request(pod) if kpods.holds_node(pod) else 0
            out[(revision, HELD, kind)] = out.get((revision, HELD, kind), 0) + gpus
            out[(revision, SERVING, kind)] = out.get((revision, SERVING, kind), 0) + (gpus if group.ready else 0)
    return out
